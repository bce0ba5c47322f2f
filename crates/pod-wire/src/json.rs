//! The little JSON the control payloads need: objects, arrays, strings, integers, booleans and
//! null, parsed with a depth bound (the engine parses what an untrusted pod sends).

use crate::Error;

/// A parsed JSON value. Numbers are integers: no control payload has fractions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The value of `name` in an object (the last one if repeated).
    pub fn get(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Object(fields) => fields.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

const MAX_DEPTH: usize = 16;

pub fn parse(bytes: &[u8]) -> Result<Value, Error> {
    let text = std::str::from_utf8(bytes).map_err(|_| err("not UTF-8"))?;
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(err("trailing bytes after the value"));
    }
    Ok(v)
}

/// Appends `s` as a JSON string.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn err(m: &str) -> Error {
    Error::Json(m.to_string())
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn literal(&mut self, word: &str, v: Value) -> Result<Value, Error> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(err("invalid literal"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, Error> {
        if depth > MAX_DEPTH {
            return Err(err("nested too deep"));
        }
        self.ws();
        match self.s.get(self.i) {
            None => Err(err("unexpected end")),
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                if self.eat(b'}') {
                    return Ok(Value::Object(fields));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    if !self.eat(b':') {
                        return Err(err("expected `:`"));
                    }
                    fields.push((k, self.value(depth + 1)?));
                    if self.eat(b'}') {
                        return Ok(Value::Object(fields));
                    }
                    if !self.eat(b',') {
                        return Err(err("expected `,` or `}`"));
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                if self.eat(b']') {
                    return Ok(Value::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b']') {
                        return Ok(Value::Array(items));
                    }
                    if !self.eat(b',') {
                        return Err(err("expected `,` or `]`"));
                    }
                }
            }
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.int(),
            Some(_) => Err(err("unexpected character")),
        }
    }

    fn int(&mut self) -> Result<Value, Error> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        while matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        if matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E')) {
            return Err(err("not an integer"));
        }
        // The slice is ASCII digits with an optional sign.
        std::str::from_utf8(&self.s[start..self.i])
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .map(Value::Int)
            .ok_or_else(|| err("integer out of range"))
    }

    fn hex4(&mut self) -> Result<u32, Error> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .ok_or_else(|| err("short \\u escape"))?;
        self.i += 4;
        std::str::from_utf8(h)
            .ok()
            .and_then(|t| u32::from_str_radix(t, 16).ok())
            .ok_or_else(|| err("bad \\u escape"))
    }

    fn string(&mut self) -> Result<String, Error> {
        if self.s.get(self.i) != Some(&b'"') {
            return Err(err("expected a string"));
        }
        self.i += 1;
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote or escape in one go (the input is valid UTF-8
            // and both delimiters are ASCII, so the run is whole characters).
            let run_end = self.s[self.i..]
                .iter()
                .position(|b| *b == b'"' || *b == b'\\' || *b < 0x20)
                .map(|p| self.i + p)
                .ok_or_else(|| err("unterminated string"))?;
            out.push_str(
                std::str::from_utf8(&self.s[self.i..run_end]).map_err(|_| err("not UTF-8"))?,
            );
            self.i = run_end;
            match self.s[self.i] {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.i += 1;
                    let e = *self
                        .s
                        .get(self.i)
                        .ok_or_else(|| err("unterminated string"))?;
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                                    return Err(err("lone surrogate"));
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(err("lone surrogate"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            out.push(char::from_u32(code).ok_or_else(|| err("bad \\u escape"))?);
                        }
                        _ => return Err(err("bad escape")),
                    }
                }
                _ => return Err(err("control character in a string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_surrogates_parse() {
        assert_eq!(
            parse(br#""a\"\\\/\n\u00e9\ud83d\ude00""#).unwrap(),
            Value::String("a\"\\/\n\u{e9}\u{1f600}".into())
        );
        assert!(parse(br#""\ud83d""#).is_err());
        assert!(parse(b"\"a\x01\"").is_err());
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(deep.as_bytes()).is_err());
        let ok = "[".repeat(10) + &"]".repeat(10);
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn numbers_are_integers() {
        assert_eq!(parse(b"-12").unwrap(), Value::Int(-12));
        assert!(parse(b"1.5").is_err());
        assert!(parse(b"99999999999999999999").is_err());
    }
}

//! The framed multiplexing protocol between the adapter (the engine) and its in-pod agent
//! (`cra-pod mux`), over the one exec stream a Kubernetes session holds. Sans-IO: frames are
//! encoded to bytes and decoded incrementally from whatever bytes arrive, so the synchronous
//! pod side and the tokio engine side share one codec.
//!
//! A frame is `kind: u8 | id: u32 BE | len: u32 BE | payload[len]` with `len <=`
//! [`MAX_PAYLOAD`]. Ids the engine chooses (processes, listeners) are below [`POD_ID_BASE`];
//! ids the pod chooses (accepted connections) are at or above it. The JSON payloads of the
//! control frames are the message types of this crate ([`Spawn`], [`Exit`], …).
//!
//! | kind | direction | payload |
//! |---|---|---|
//! | `Ready` | pod→engine | id 0: [`Hello`], first frame of `mux`; a listener id: it listens (`{}`) |
//! | `Spawn` | engine→pod | [`Spawn`]: start a process in its own process group |
//! | `Stdout`, `Stderr` | pod→engine | bytes of a process's output |
//! | `Exit` | pod→engine | [`Exit`], after both output pipes hit EOF and the process was reaped |
//! | `Data` | both | bytes for a process's stdin (engine→pod) or a connection (both ways) |
//! | `Eof` | both | end of one direction: a process's stdin, a connection's half |
//! | `Signal` | engine→pod | [`SignalRequest`]: signal a process's group |
//! | `Listen` | engine→pod | [`Listen`]: bind a unix socket in the pod |
//! | `Open` | pod→engine | [`Open`]: a connection (pod id) accepted on a listener |
//! | `Close` | both | drop a connection both ways; pod→engine on a listener id: [`Failure`] |
//! | `Bye` | engine→pod | kill everything started, unlink the sockets, exit |

mod json;

use std::fmt;

pub use json::Value;

/// The largest payload a frame may carry; a bigger length is a protocol error.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Bytes before the payload: kind, id, length.
pub const HEADER_LEN: usize = 9;
/// The first id the pod chooses (accepted connections); the engine's ids are below it.
pub const POD_ID_BASE: u32 = 1 << 31;
/// The protocol version [`Hello`] announces.
pub const VERSION: i64 = 1;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Ready = 1,
    Spawn = 2,
    Stdout = 3,
    Stderr = 4,
    Exit = 5,
    Data = 6,
    Eof = 7,
    Signal = 8,
    Listen = 9,
    Open = 10,
    Close = 11,
    Bye = 12,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::Ready,
        Kind::Spawn,
        Kind::Stdout,
        Kind::Stderr,
        Kind::Exit,
        Kind::Data,
        Kind::Eof,
        Kind::Signal,
        Kind::Listen,
        Kind::Open,
        Kind::Close,
        Kind::Bye,
    ];

    pub fn from_u8(b: u8) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| *k as u8 == b)
    }
}

/// A protocol error: the stream cannot be trusted past it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A payload longer than [`MAX_PAYLOAD`].
    Oversize { kind: u8, id: u32, len: usize },
    /// A kind byte this version does not know.
    UnknownKind(u8),
    /// A control payload that is not the JSON its kind needs.
    Json(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Oversize { kind, id, len } => write!(
                f,
                "frame of kind {kind} for id {id} has a {len}-byte payload (at most {MAX_PAYLOAD})"
            ),
            Error::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            Error::Json(m) => write!(f, "bad control payload: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub id: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(kind: Kind, id: u32, payload: impl Into<Vec<u8>>) -> Frame {
        Frame {
            kind,
            id,
            payload: payload.into(),
        }
    }

    /// Its bytes on the wire.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        encode(self.kind, self.id, &self.payload)
    }
}

/// The bytes of one frame; an oversize payload is an error, never a truncated frame.
pub fn encode(kind: Kind, id: u32, payload: &[u8]) -> Result<Vec<u8>, Error> {
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::Oversize {
            kind: kind as u8,
            id,
            len: payload.len(),
        });
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(kind as u8);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Frames out of a byte stream fed in pieces of any size. After an error it keeps returning
/// that error: nothing after a bad header can be framed.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    failed: Option<Error>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Adds bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        // Drop what was consumed before growing, so the buffer stays about one frame.
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes fed but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame, `None` until more bytes arrive. A header is checked as soon as
    /// it is complete, so an oversize length fails before its payload is waited for.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, Error> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let rest = &self.buf[self.start..];
        if rest.len() < HEADER_LEN {
            return Ok(None);
        }
        let kind_byte = rest[0];
        let id = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
        let len = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) as usize;
        let Some(kind) = Kind::from_u8(kind_byte) else {
            return Err(self.fail(Error::UnknownKind(kind_byte)));
        };
        if len > MAX_PAYLOAD {
            return Err(self.fail(Error::Oversize {
                kind: kind_byte,
                id,
                len,
            }));
        }
        if rest.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = rest[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.start += HEADER_LEN + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(Frame { kind, id, payload }))
    }

    fn fail(&mut self, e: Error) -> Error {
        self.failed = Some(e.clone());
        self.buf = Vec::new();
        self.start = 0;
        e
    }
}

fn object(payload: &[u8]) -> Result<Value, Error> {
    let v = json::parse(payload)?;
    match v {
        Value::Object(_) => Ok(v),
        _ => Err(Error::Json("not a JSON object".into())),
    }
}

fn int_field(v: &Value, name: &str) -> Result<Option<i64>, Error> {
    match v.get(name) {
        None => Ok(None),
        Some(Value::Int(n)) => Ok(Some(*n)),
        Some(_) => Err(Error::Json(format!("`{name}` is not an integer"))),
    }
}

fn i32_field(v: &Value, name: &str) -> Result<Option<i32>, Error> {
    int_field(v, name)?
        .map(|n| i32::try_from(n).map_err(|_| Error::Json(format!("`{name}` is out of range"))))
        .transpose()
}

fn str_field<'a>(v: &'a Value, name: &str) -> Result<Option<&'a str>, Error> {
    match v.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::Json(format!("`{name}` is not a string"))),
    }
}

fn required<T>(v: Option<T>, name: &str) -> Result<T, Error> {
    v.ok_or_else(|| Error::Json(format!("`{name}` is missing")))
}

/// `Ready` on id 0: the pod agent is up and speaks this version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: i64,
}

impl Hello {
    pub fn to_json(&self) -> Vec<u8> {
        format!("{{\"version\":{}}}", self.version).into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<Hello, Error> {
        let v = object(payload)?;
        Ok(Hello {
            version: required(int_field(&v, "version")?, "version")?,
        })
    }
}

/// `Spawn`: a process with exactly this environment (the pod agent adds nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spawn {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

impl Spawn {
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = String::from("{\"argv\":[");
        for (i, a) in self.argv.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            json::write_str(&mut out, a);
        }
        out.push_str("],\"env\":[");
        for (i, (k, v)) in self.env.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('[');
            json::write_str(&mut out, k);
            out.push(',');
            json::write_str(&mut out, v);
            out.push(']');
        }
        out.push_str("],\"cwd\":");
        json::write_str(&mut out, &self.cwd);
        out.push('}');
        out.into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<Spawn, Error> {
        let v = object(payload)?;
        let strings = |x: &Value, what: &str| -> Result<Vec<String>, Error> {
            match x {
                Value::Array(items) => items
                    .iter()
                    .map(|i| match i {
                        Value::String(s) => Ok(s.clone()),
                        _ => Err(Error::Json(format!("`{what}` holds a non-string"))),
                    })
                    .collect(),
                _ => Err(Error::Json(format!("`{what}` is not an array"))),
            }
        };
        let argv = strings(required(v.get("argv"), "argv")?, "argv")?;
        if argv.is_empty() {
            return Err(Error::Json("`argv` is empty".into()));
        }
        let env = match required(v.get("env"), "env")? {
            Value::Array(pairs) => pairs
                .iter()
                .map(|p| match strings(p, "env")?.as_slice() {
                    [k, v] => Ok((k.clone(), v.clone())),
                    _ => Err(Error::Json(
                        "an `env` entry is not a [name, value] pair".into(),
                    )),
                })
                .collect::<Result<Vec<_>, Error>>()?,
            _ => return Err(Error::Json("`env` is not an array".into())),
        };
        let cwd = required(str_field(&v, "cwd")?, "cwd")?.to_string();
        Ok(Spawn { argv, env, cwd })
    }
}

/// `Exit`: how a process ended, or why it never started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    Error(String),
}

impl Exit {
    pub fn to_json(&self) -> Vec<u8> {
        match self {
            Exit::Code(n) => format!("{{\"code\":{n}}}"),
            Exit::Signal(n) => format!("{{\"signal\":{n}}}"),
            Exit::Error(m) => {
                let mut out = String::from("{\"error\":");
                json::write_str(&mut out, m);
                out.push('}');
                out
            }
        }
        .into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<Exit, Error> {
        let v = object(payload)?;
        if let Some(n) = i32_field(&v, "code")? {
            return Ok(Exit::Code(n));
        }
        if let Some(n) = i32_field(&v, "signal")? {
            return Ok(Exit::Signal(n));
        }
        if let Some(m) = str_field(&v, "error")? {
            return Ok(Exit::Error(m.to_string()));
        }
        Err(Error::Json(
            "an exit has none of `code`, `signal`, `error`".into(),
        ))
    }
}

/// `Signal`: the signal for a process's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalRequest {
    pub signal: i32,
}

impl SignalRequest {
    pub fn to_json(&self) -> Vec<u8> {
        format!("{{\"signal\":{}}}", self.signal).into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<SignalRequest, Error> {
        let v = object(payload)?;
        let signal = required(i32_field(&v, "signal")?, "signal")?;
        if !(1..=64).contains(&signal) {
            return Err(Error::Json(format!(
                "signal {signal} is not a signal number"
            )));
        }
        Ok(SignalRequest { signal })
    }
}

/// `Listen`: a unix socket path in the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub path: String,
}

impl Listen {
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = String::from("{\"path\":");
        json::write_str(&mut out, &self.path);
        out.push('}');
        out.into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<Listen, Error> {
        let v = object(payload)?;
        Ok(Listen {
            path: required(str_field(&v, "path")?, "path")?.to_string(),
        })
    }
}

/// `Open`: the listener a connection was accepted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    pub listener: u32,
}

impl Open {
    pub fn to_json(&self) -> Vec<u8> {
        format!("{{\"listener\":{}}}", self.listener).into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<Open, Error> {
        let v = object(payload)?;
        let n = required(int_field(&v, "listener")?, "listener")?;
        let listener = u32::try_from(n)
            .ok()
            .filter(|l| *l < POD_ID_BASE)
            .ok_or_else(|| Error::Json(format!("listener {n} is not an engine id")))?;
        Ok(Open { listener })
    }
}

/// The payload of a `Close` the pod sends for a listener it could not bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: String,
}

impl Failure {
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = String::from("{\"error\":");
        json::write_str(&mut out, &self.error);
        out.push('}');
        out.into_bytes()
    }

    pub fn from_json(payload: &[u8]) -> Result<Failure, Error> {
        let v = object(payload)?;
        Ok(Failure {
            error: required(str_field(&v, "error")?, "error")?.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8], piece: usize) -> Result<Vec<Frame>, Error> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for chunk in bytes.chunks(piece.max(1)) {
            d.feed(chunk);
            while let Some(f) = d.next_frame()? {
                out.push(f);
            }
        }
        Ok(out)
    }

    #[test]
    fn a_frame_is_kind_id_length_payload_big_endian() {
        let b = encode(Kind::Data, 0x0102_0304, b"hi").unwrap();
        assert_eq!(b, [6, 1, 2, 3, 4, 0, 0, 0, 2, b'h', b'i']);
    }

    #[test]
    fn frames_split_at_every_byte_decode_whole() {
        let mut bytes = Vec::new();
        let frames = [
            Frame::new(Kind::Ready, 0, Hello { version: 1 }.to_json()),
            Frame::new(Kind::Eof, 7, Vec::new()),
            Frame::new(Kind::Stdout, POD_ID_BASE + 3, vec![0u8, 255, 10, 13]),
        ];
        for f in &frames {
            bytes.extend(f.encode().unwrap());
        }
        for piece in 1..bytes.len() {
            assert_eq!(decode_all(&bytes, piece).unwrap(), frames);
        }
    }

    #[test]
    fn an_oversize_payload_is_refused_both_ways() {
        assert!(matches!(
            encode(Kind::Data, 1, &vec![0; MAX_PAYLOAD + 1]),
            Err(Error::Oversize { .. })
        ));
        assert!(encode(Kind::Data, 1, &vec![0; MAX_PAYLOAD]).is_ok());
        // The header alone fails: the decoder does not wait for (or buffer) the payload.
        let mut header = vec![Kind::Stdout as u8, 0, 0, 0, 1];
        header.extend(((MAX_PAYLOAD + 1) as u32).to_be_bytes());
        let mut d = Decoder::new();
        d.feed(&header);
        assert!(matches!(d.next_frame(), Err(Error::Oversize { .. })));
        // And it stays failed.
        d.feed(&encode(Kind::Bye, 0, b"").unwrap());
        assert!(d.next_frame().is_err());
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn an_unknown_kind_is_an_error() {
        let mut d = Decoder::new();
        d.feed(&[0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(Error::UnknownKind(0)));
        let mut d = Decoder::new();
        d.feed(&[13, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(Error::UnknownKind(13)));
    }

    #[test]
    fn control_payloads_round_trip() {
        let s = Spawn {
            argv: vec!["sh".into(), "-c".into(), "echo \"é\" \\ \n\t\u{1}".into()],
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("EMPTY".into(), String::new()),
            ],
            cwd: "/workspace".into(),
        };
        assert_eq!(Spawn::from_json(&s.to_json()).unwrap(), s);
        for e in [
            Exit::Code(0),
            Exit::Code(-1),
            Exit::Signal(9),
            Exit::Error("spawn failed: \"x\"".into()),
        ] {
            assert_eq!(Exit::from_json(&e.to_json()).unwrap(), e);
        }
        let l = Listen {
            path: "/var/lib/cra/sockets/model.sock".into(),
        };
        assert_eq!(Listen::from_json(&l.to_json()).unwrap(), l);
        assert_eq!(
            Open::from_json(&Open { listener: 5 }.to_json())
                .unwrap()
                .listener,
            5
        );
        assert_eq!(
            SignalRequest::from_json(b"{\"signal\":15}").unwrap().signal,
            15
        );
        assert_eq!(Hello::from_json(b" {\"version\" : 1} ").unwrap().version, 1);
        let f = Failure {
            error: "bind: denied".into(),
        };
        assert_eq!(Failure::from_json(&f.to_json()).unwrap(), f);
    }

    #[test]
    fn bad_control_payloads_are_errors_naming_the_field() {
        let err = |r: Result<Spawn, Error>| r.unwrap_err().to_string();
        assert!(err(Spawn::from_json(b"{\"argv\":[],\"env\":[],\"cwd\":\"/\"}")).contains("argv"));
        assert!(err(Spawn::from_json(
            b"{\"argv\":[\"a\"],\"env\":[[\"k\"]],\"cwd\":\"/\"}"
        ))
        .contains("env"));
        assert!(err(Spawn::from_json(b"{\"argv\":[\"a\"],\"env\":[]}")).contains("cwd"));
        assert!(Exit::from_json(b"{}").is_err());
        assert!(Exit::from_json(b"{\"code\":99999999999}").is_err());
        assert!(SignalRequest::from_json(b"{\"signal\":0}").is_err());
        assert!(Open::from_json(b"{\"listener\":2147483648}").is_err());
        assert!(Hello::from_json(b"[1]").is_err());
        assert!(Hello::from_json(b"{\"version\":1").is_err());
        assert!(Hello::from_json(b"\xff").is_err());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn frame() -> impl Strategy<Value = Frame> {
            (
                0..Kind::ALL.len(),
                any::<u32>(),
                proptest::collection::vec(any::<u8>(), 0..2048),
            )
                .prop_map(|(k, id, payload)| Frame::new(Kind::ALL[k], id, payload))
        }

        proptest! {
            #[test]
            fn any_frames_in_any_pieces_round_trip(
                frames in proptest::collection::vec(frame(), 0..20),
                piece in 1usize..5000,
            ) {
                let mut bytes = Vec::new();
                for f in &frames {
                    bytes.extend(f.encode().unwrap());
                }
                prop_assert_eq!(decode_all(&bytes, piece).unwrap(), frames);
            }

            #[test]
            fn any_spawn_round_trips(
                argv in proptest::collection::vec(any::<String>(), 1..5),
                env in proptest::collection::vec((any::<String>(), any::<String>()), 0..5),
                cwd in any::<String>(),
            ) {
                let s = Spawn { argv, env, cwd };
                prop_assert_eq!(Spawn::from_json(&s.to_json()).unwrap(), s);
            }

            #[test]
            fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
                let _ = decode_all(&bytes, 7);
                let _ = Spawn::from_json(&bytes);
                let _ = Exit::from_json(&bytes);
            }
        }
    }
}

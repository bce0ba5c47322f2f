use napi_derive::napi;

#[napi]
pub fn ping() -> String {
    "pong".into()
}

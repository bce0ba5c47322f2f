//! `outputSchemas`: the JSON Schemas the agents must satisfy, exported as a constant object.

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::domain::Role;
use crate::schema::output_schema;

#[napi(module_exports)]
pub fn init(mut exports: Object) -> Result<()> {
    let mut schemas = serde_json::Map::new();
    for role in [Role::Planner, Role::Implementor, Role::Reviewer] {
        schemas.insert(role.as_str().to_string(), output_schema(role).clone());
    }
    exports.set("outputSchemas", serde_json::Value::Object(schemas))?;
    Ok(())
}

//! Everything that knows the Claude Code CLI: where it is (`locate`), how it is started
//! (`command`), what it says on the wire (`protocol`), and running one process through a
//! session (`session`, `process`). Nothing outside this module speaks stream-json.

pub mod command;
pub mod ids;
pub mod locate;
pub mod protocol;
pub mod session;

//! What the `cra-pod` tests share.

use std::path::{Path, PathBuf};

/// `dir`'s `lower`, `upper`, `work` and `target` (made if missing), and the layer file naming
/// them as an overlay, written at `dir/layer`: the file and its text.
pub fn overlay_file(dir: &Path) -> (PathBuf, String) {
    for d in ["lower", "upper", "work", "target"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let p = |d: &str| dir.join(d).display().to_string();
    let text = format!(
        "lower={}\nupper={}\nwork={}\ntarget={}\n",
        p("lower"),
        p("upper"),
        p("work"),
        p("target")
    );
    let file = dir.join("layer");
    std::fs::write(&file, &text).unwrap();
    (file, text)
}

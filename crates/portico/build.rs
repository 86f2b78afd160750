//! Records the git commit the binary is built from, for `portico --version`.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| o.status.success() && !o.stdout.is_empty());
    // A label tells apart two builds of one commit (bench/RESULTS.md's upgrade runs build the source twice).
    let label = std::env::var("PORTICO_BUILD_LABEL")
        .ok()
        .filter(|l| !l.is_empty())
        .map(|l| format!(", build {l}"))
        .unwrap_or_default();
    println!("cargo:rustc-env=PORTICO_GIT_COMMIT={commit}{}{label}", if dirty { "-modified" } else { "" });
    println!("cargo:rerun-if-env-changed=PORTICO_BUILD_LABEL");
    // Rebuilt when the checked-out commit moves (the paths are relative to this crate).
    for path in ["../../.git/HEAD", "../../.git/index"] {
        println!("cargo:rerun-if-changed={path}");
    }
}

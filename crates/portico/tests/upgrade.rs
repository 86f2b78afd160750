//! Zero-downtime upgrade between two different builds: an older Portico, built from the git history, is replaced
//! on disk by this build and told to upgrade (SIGUSR2) under load and during a long download. Not one request
//! may fail and no connection may be refused.

mod common;
use common::*;
use portico_testkit::Backend;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The old build: the first commit whose drain answers a new connection's first request. From earlier builds
/// (the hand-over came in f838201) an upgrade can cut the few connections the old process accepted just before
/// it began to drain (bench/RESULTS.md, 2026-11-23).
const OLD_COMMIT: &str = "42c76d3";
/// curl's rate limit for the download across the upgrade (12 MiB/s), and how long it runs before SIGUSR2.
const DOWNLOAD_RATE: u64 = 12 << 20;
const LEAD: Duration = Duration::from_millis(500);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the old Portico from `OLD_COMMIT` (once: the target directory is kept between runs; the first time it
/// is a second full build) and returns its binary. `None` when the git history does not have that commit (a
/// shallow clone, a source archive, no git): there is no older build to upgrade from, so the test is skipped.
fn build_old(test: &str) -> Option<PathBuf> {
    let root = workspace();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let has_commit = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["cat-file", "-e", &format!("{OLD_COMMIT}^{{commit}}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_commit {
        skip_outside_ci(
            test,
            &format!(
                "commit {OLD_COMMIT} is not in the git history (a shallow clone?): it builds that older release to \
                 upgrade from; `git fetch --unshallow` brings the history"
            ),
        );
        return None;
    }
    let target = tmp.join("upgrade-old-build");
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // One job: the other test binaries run at the same time.
    build.args(["build", "--bin", "portico", "-j", "1"]).env("CARGO_TARGET_DIR", &target);
    // What `cargo test` set for this test binary is not for that build (ring's build script would see this
    // crate's CARGO_MANIFEST_DIR, and run again whenever it differs from the last build's).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let per_unit =
            ["CARGO_PKG_", "CARGO_BIN_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_PRIMARY_", "CARGO_TARGET_TMPDIR"];
        if per_unit.iter().any(|prefix| name.starts_with(prefix)) || name == "OUT_DIR" {
            build.env_remove(&*name);
        }
    }
    let src = tmp.join(format!("upgrade-old-src-{OLD_COMMIT}"));
    if !src.exists() {
        extract(&root, &src);
    }
    // The old build.rs asks git for the commit. Outside any repository it records "unknown"; a source
    // directory under the workspace (its target/ directory) would record the workspace's commit instead.
    build.current_dir(&src).env("GIT_DIR", src.join(".git"));
    eprintln!("building the old Portico (commit {OLD_COMMIT}) in {} (the first time takes minutes)", target.display());
    let started = Instant::now();
    let out = build.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "building the old Portico (commit {OLD_COMMIT}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("built the old Portico (commit {OLD_COMMIT}) in {:.1?}", started.elapsed());
    Some(target.join("debug").join("portico"))
}

/// `git archive OLD_COMMIT` unpacked at `src`, through a directory renamed into place when complete (a run
/// that was interrupted leaves no half source behind).
fn extract(root: &Path, src: &Path) {
    let partial = src.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).expect("a directory for the old source");
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["archive", "--format=tar", OLD_COMMIT])
        .stdout(Stdio::piped())
        .spawn()
        .expect("git runs");
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&partial)
        .stdin(archive.stdout.take().expect("git's output"))
        .status()
        .expect("tar runs");
    let git = archive.wait().expect("git archive ends");
    assert!(git.success() && tar.success(), "git archive {OLD_COMMIT} | tar -x failed ({git}, {tar})");
    // Another run may have put it there first: its copy is the same.
    if std::fs::rename(&partial, src).is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
}

/// The first line of `bin --version` without the program name: "0.1.0 (commit ...)".
fn version_of(bin: &Path) -> String {
    let out = Command::new(bin).arg("--version").output().expect("the binary runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("portico "))
        .unwrap_or_else(|| panic!("{} --version printed {text:?}", bin.display()))
        .to_string()
}

/// The size of the download: what curl reads before SIGUSR2, plus what the kernel can hold between Portico and
/// curl (Portico's send buffer and curl's receive buffer, at their largest), plus 2 s worth that the old process
/// must still send while it drains. Smaller, the whole rest of the response can sit in those buffers when the
/// signal comes, and the old process exits at once without proving anything about draining.
fn download_size() -> u64 {
    let max_buffer = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .ok()
            .and_then(|v| v.split_whitespace().nth(2)?.parse::<u64>().ok())
            .unwrap_or(32 << 20)
    };
    let lead = DOWNLOAD_RATE * LEAD.as_millis() as u64 / 1000;
    lead + max_buffer("tcp_wmem") + max_buffer("tcp_rmem") + 2 * DOWNLOAD_RATE
}

/// Gone, or a zombie waiting for whoever adopted it.
fn is_gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
}

/// When the test ends, failed or not: whatever runs with its configuration file is killed (the process an
/// upgrade started is not the test's child), and the copies of the binaries (140 MB each in a debug build) go.
struct Cleanup {
    config: String,
    bin_dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_processes_with_arg(&self.config);
        let _ = std::fs::remove_dir_all(&self.bin_dir);
    }
}

#[test]
fn sigusr2_upgrades_to_a_different_build_under_load_without_failing_a_request() {
    let Some(old_build) = build_old("sigusr2_upgrades_to_a_different_build_under_load_without_failing_a_request")
    else {
        return;
    };
    let new_build = Path::new(portico_bin());
    let (old_version, new_version) = (version_of(&old_build), version_of(new_build));
    assert!(
        !old_version.contains(&new_version) && !new_version.contains(&old_version),
        "the two builds must tell apart by version: old {old_version:?}, new {new_version:?}"
    );
    eprintln!("upgrading from {old_version:?} to {new_version:?}");

    // The old build runs from <dir>/bin/portico, where the new one will be installed.
    let dir = temp_dir();
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin directory");
    let _cleanup = Cleanup { config: dir.join("portico.yaml").display().to_string(), bin_dir: bin_dir.clone() };
    let installed = bin_dir.join("portico");
    std::fs::copy(&old_build, &installed).expect("copy the old build");
    let b = Backend::start("b0").expect("backend");
    // Keys the old build knows too.
    let mut p = Portico::start_binary_in(
        &installed,
        &dir,
        &format!(
            "workers: 2\nshutdown: {{ grace: 10s }}\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{}\" }} ] }} }}\n",
            b.addr
        ),
    );
    let old_pid = p.pid();
    // `start_binary_in` returned once `/ready` answered 200: the old build handles SIGUSR2 from then on.

    let load = Load::reconnecting(p.addr, 8);
    let size = download_size();
    let download = {
        let url = p.url(&format!("/bytes/{size}"));
        std::thread::spawn(move || {
            let started = Instant::now();
            let out = Command::new("curl")
                .args(["-sS", "--max-time", "60", "--limit-rate", &DOWNLOAD_RATE.to_string(), "-o", "/dev/null"])
                .args(["-w", "%{size_download}"])
                .arg(&url)
                .output()
                .expect("curl is installed");
            (out, started.elapsed())
        })
    };
    std::thread::sleep(LEAD);

    // Install the new build as `install` does: a copy under another name, renamed over the old file.
    let staged = bin_dir.join(".portico.new");
    std::fs::copy(new_build, &staged).expect("copy the new build");
    std::fs::rename(&staged, &installed).expect("rename the new build into place");
    let exe = std::fs::read_link(format!("/proc/{old_pid}/exe")).expect("the old process's binary");
    assert!(exe.to_string_lossy().ends_with(" (deleted)"), "the old process's binary was not replaced: {exe:?}");
    assert!(!download.is_finished(), "the download ended before the upgrade began");

    let signalled = Instant::now();
    p.signal(libc::SIGUSR2);
    let status = p.wait_exit(Duration::from_secs(20)).expect("the old process exits within 20 s of SIGUSR2");
    assert!(status.success(), "the old process exited with {status:?}");
    let handed_over_in = signalled.elapsed();

    // The new build serves, on the same port and admin address.
    let r = p.admin_get("/admin/process");
    // The old process answers /admin/process too: its pid here means it still serves.
    assert_eq!(r.status, 200, "/admin/process is not served: {}", r.text().trim());
    let process: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON from /admin/process");
    let new_pid = process["pid"].as_i64().expect("a pid in /admin/process") as i32;
    let version = process["version"].as_str().unwrap_or_default();
    assert_ne!(new_pid, old_pid, "the old process still answers /admin/process");
    assert!(
        version.contains(&new_version) && !version.contains(&old_version),
        "/admin/process shows version {version:?}; expected the new build's {new_version:?}, not the old \
         build's {old_version:?}"
    );
    // Some load on the new process alone, then the tally.
    std::thread::sleep(Duration::from_millis(500));
    let (ok, failures) = load.finish();
    let (refused, failed): (Vec<String>, Vec<String>) = failures.into_iter().partition(|f| f.starts_with("connect:"));
    assert!(refused.is_empty(), "{} connections refused: {refused:?}", refused.len());
    assert!(failed.is_empty(), "{} requests failed: {failed:?}", failed.len());
    assert!(ok > 100, "only {ok} requests were served");
    let (out, download_took) = download.join().expect("download thread");
    assert!(out.status.success(), "the download failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        size.to_string(),
        "the download across the upgrade was cut short"
    );
    eprintln!(
        "old pid {old_pid} handed over to pid {new_pid} and exited {handed_over_in:.1?} after SIGUSR2; {ok} requests \
         served; {} MB downloaded in {download_took:.1?}",
        size / 1_000_000
    );

    // Stop the new process: nothing is left running.
    unsafe { libc::kill(new_pid, libc::SIGKILL) };
    wait_until("the new process is gone", Duration::from_secs(5), || is_gone(new_pid));
}

//! Records the git commit the binary is built from, for `keypool --version` and the
//! `keypool_build_info` metric. A build outside a git checkout (a source tarball, a
//! container build without `.git`) takes `KEYPOOL_GIT_COMMIT` from the environment
//! (the Dockerfile's build argument), else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KEYPOOL_GIT_COMMIT");
    let commit = std::env::var("KEYPOOL_GIT_COMMIT")
        .ok()
        .filter(|c| is_commit(c))
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=KEYPOOL_GIT_COMMIT={commit}");
}

/// `git rev-parse --short=12 HEAD`, and the files to watch so that a new commit rebuilds.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| is_commit(c))?;
    // HEAD moves when a commit is made or a branch checked out (a worktree's HEAD lives
    // in its own git dir); the branch's ref file, or packed-refs when the ref is packed.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for file in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &file])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

/// A short or full hexadecimal commit id (nothing else goes into the binary).
fn is_commit(c: &str) -> bool {
    (7..=40).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_hexdigit())
}

//! The bearer token: `KEEL_TOKEN`, or one generated into the data dir on
//! first start (mode 0600, so only its owner, and the CLI run by its owner,
//! can read it), and the constant-time check every request goes through.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use subtle::ConstantTimeEq;

/// The file in the data dir that holds a generated token.
pub const TOKEN_FILE: &str = "token";

pub fn token_path(data_dir: &Path) -> PathBuf {
    data_dir.join(TOKEN_FILE)
}

/// The token to require: `configured` if set, else the one in the data
/// dir, generated there if there is none yet.
pub fn load_or_generate(configured: Option<String>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(token) = configured {
        return Ok(token);
    }
    let path = token_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_owned()),
        Ok(_) => anyhow::bail!(
            "{} is empty; delete it to have a new token generated, or set KEEL_TOKEN",
            path.display()
        ),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(error).with_context(|| format!("reading the token in {}", path.display()))
        }
    }
    let token = generate()?;
    write_private(&path, &token)
        .with_context(|| format!("writing a new token to {}", path.display()))?;
    Ok(token)
}

/// 32 random bytes from the operating system, as hex.
fn generate() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| anyhow::anyhow!("no randomness: {error}"))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Create `path` readable by its owner only; never overwrite one.
fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(token.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

/// Whether an `Authorization` header value carries `token`, compared in
/// constant time (the length of the expected token aside).
pub fn authorizes(header: Option<&[u8]>, token: &str) -> bool {
    let Some(presented) = header.and_then(|value| value.strip_prefix(b"Bearer ")) else {
        return false;
    };
    matches(presented, token)
}

/// Whether `presented` is `token`, compared in constant time.
pub fn matches(presented: &[u8], token: &str) -> bool {
    presented.ct_eq(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_is_private_and_kept_across_starts() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_generate(None, dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        let second = load_or_generate(None, dir.path()).unwrap();
        assert_eq!(first, second);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(token_path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let configured = load_or_generate(Some("mine".into()), dir.path()).unwrap();
        assert_eq!(configured, "mine");
    }

    #[test]
    fn only_the_exact_bearer_token_authorizes() {
        assert!(authorizes(Some(b"Bearer abc"), "abc"));
        assert!(!authorizes(Some(b"Bearer abd"), "abc"));
        assert!(!authorizes(Some(b"Bearer ab"), "abc"));
        assert!(!authorizes(Some(b"Bearer abcd"), "abc"));
        assert!(!authorizes(Some(b"bearer abc"), "abc"));
        assert!(!authorizes(Some(b"abc"), "abc"));
        assert!(!authorizes(None, "abc"));
    }
}

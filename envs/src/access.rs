//! Who may use a listening surface: the metrics endpoint and web UI, `agent-r1 view`, the
//! weight server, the OpenAI endpoint.
//!
//! A surface on a loopback address is reachable only from this machine and admits every
//! request unless it is given a token. One bound anywhere else must have a bearer token, read
//! from the first line of a file (like the cluster cookie); without one it is refused before
//! it starts. With a token, every request must carry `Authorization: Bearer TOKEN`, except
//! those to paths configured open (`/metrics` for a Prometheus that cannot send one).
//!
//! [`check_exposure`] is the config-time rule (`check-config` runs it without reading any
//! file); [`Access::load`] reads the token when the surface starts and is what servers hold.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use subtle::ConstantTimeEq;

use crate::config::ConfigError;

/// Shortest token accepted: anything shorter could be guessed by a client trying for long.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The keys a surface's settings go by in its config, so that errors name them: an error's
/// key is relative to `section` (its caller places it), its message names keys in full.
#[derive(Debug, Clone, Copy)]
pub struct AccessKeys {
    /// The section the keys are in, e.g. `metrics` (empty for command-line flags).
    pub section: &'static str,
    /// Where it listens, e.g. `address`.
    pub address: &'static str,
    /// Its token file, e.g. `token_file`.
    pub token_file: &'static str,
    /// Its open paths, e.g. `open_paths` (empty when the surface has none).
    pub open_paths: &'static str,
}

impl AccessKeys {
    /// `key` as a user finds it: `metrics.token_file`, `--token-file`.
    fn full(&self, key: &str) -> String {
        if self.section.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.section)
        }
    }
}

/// The config-time rule: an address other than loopback needs a token file; open paths are
/// well formed. Reads nothing.
pub fn check_exposure(
    keys: AccessKeys,
    addr: SocketAddr,
    token_file: Option<&Path>,
    open_paths: &[String],
) -> Result<(), ConfigError> {
    if token_file.is_none() && !addr.ip().is_loopback() {
        return Err(ConfigError::new(
            keys.address,
            format!(
                "{addr} is reachable from other machines, so it needs a bearer token: set \
                 `{}` (a file whose first line is the token clients send), or listen on \
                 127.0.0.1",
                keys.full(keys.token_file)
            ),
        ));
    }
    for path in open_paths {
        OpenPath::parse(path).map_err(|why| {
            ConfigError::range(
                keys.open_paths,
                format!("{path:?} ({why})"),
                "absolute paths such as \"/metrics\", or a prefix ending in \"/*\" such as \
                 \"/ui/*\"",
            )
        })?;
    }
    if token_file.is_none() && !open_paths.is_empty() {
        return Err(ConfigError::new(
            keys.open_paths,
            format!(
                "set without `{}`: with no token every path is open already",
                keys.full(keys.token_file)
            ),
        ));
    }
    Ok(())
}

/// A bearer token; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// Reads `path`'s first line. `key` names the setting in errors.
    pub fn read(key: &str, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                key,
                format!("{}: cannot read the token: {e}", path.display()),
            )
        })?;
        let line = text.lines().next().unwrap_or("").trim();
        let bad = |why: String| ConfigError::new(key, format!("{}: {why}", path.display()));
        if line.chars().count() < MIN_TOKEN_CHARS {
            return Err(bad(format!(
                "its first line holds {} characters; a token needs at least {MIN_TOKEN_CHARS} \
                 (e.g. `openssl rand -hex 32 > {}`)",
                line.chars().count(),
                path.display()
            )));
        }
        if let Some(c) = line.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(bad(format!(
                "the token holds {c:?}; allowed: visible ASCII characters (it travels in an \
                 HTTP header)"
            )));
        }
        Ok(Self(line.to_string()))
    }

    /// The token, to hand to a client that must present it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether an `Authorization` header value presents this token, compared in constant
    /// time.
    pub fn presented_in(&self, authorization: &[u8]) -> bool {
        let Some(given) = authorization.strip_prefix(b"Bearer ") else {
            return false;
        };
        let given = given.trim_ascii();
        given.len() == self.0.len() && bool::from(given.ct_eq(self.0.as_bytes()))
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

/// A path admitted without a token: exact, or every path under a prefix (`/ui/*`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum OpenPath {
    Exact(String),
    Under(String),
}

impl OpenPath {
    fn parse(text: &str) -> Result<Self, &'static str> {
        if !text.starts_with('/') {
            return Err("not absolute");
        }
        if text.contains(['?', '#', '%']) || text.split('/').any(|s| s == "." || s == "..") {
            return Err("a plain path: no query, fragment, escapes or dot segments");
        }
        match text.strip_suffix('*') {
            Some(prefix) if prefix.ends_with('/') && !prefix.contains('*') => {
                Ok(Self::Under(prefix.to_string()))
            }
            Some(_) => Err("`*` only as the last segment, after a `/`"),
            None if text.contains('*') => Err("`*` only as the last segment, after a `/`"),
            None => Ok(Self::Exact(text.to_string())),
        }
    }

    /// Whether `path` is this. A path with dot segments or escapes is never open: it could
    /// name something outside the prefix once resolved.
    fn admits(&self, path: &str) -> bool {
        if path.contains('%') || path.split('/').any(|s| s == "." || s == "..") {
            return false;
        }
        match self {
            Self::Exact(p) => path == p,
            Self::Under(prefix) => path.starts_with(prefix.as_str()),
        }
    }
}

/// What a surface admits; built once when it starts ([`Access::load`]).
#[derive(Debug, Clone)]
pub struct Access {
    token: Option<BearerToken>,
    open: Vec<OpenPath>,
    token_key: String,
}

/// A request refused for want of the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unauthorized {
    /// What the client is told (names the setting that holds the token, never the token).
    pub message: String,
}

impl Access {
    /// Checks [`check_exposure`] and reads the token file, if any.
    pub fn load(
        keys: AccessKeys,
        addr: SocketAddr,
        token_file: Option<&Path>,
        open_paths: &[String],
    ) -> Result<Self, ConfigError> {
        check_exposure(keys, addr, token_file, open_paths)?;
        let token = token_file
            .map(|path| BearerToken::read(keys.token_file, path))
            .transpose()?;
        let open = open_paths
            .iter()
            .filter_map(|p| OpenPath::parse(p).ok())
            .collect();
        Ok(Self {
            token,
            open,
            token_key: keys.full(keys.token_file),
        })
    }

    /// Admits every request: for a surface on loopback only (servers refuse to start with it
    /// on any other address).
    pub fn unauthenticated() -> Self {
        Self {
            token: None,
            open: vec![],
            token_key: String::new(),
        }
    }

    /// Whether a server with this access may listen on `addr`: loopback, or with a token.
    pub fn may_listen_on(&self, addr: SocketAddr) -> bool {
        self.token.is_some() || addr.ip().is_loopback()
    }

    /// [`Self::may_listen_on`] as the error a server that refuses to start returns (`what`
    /// names the server): defence in depth behind the config's check.
    pub fn check_listen(&self, what: &str, addr: SocketAddr) -> std::io::Result<()> {
        if self.may_listen_on(addr) {
            return Ok(());
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{what}: {addr} is reachable from other machines and no bearer token is set"),
        ))
    }

    /// Whether requests must present a token.
    pub fn requires_token(&self) -> bool {
        self.token.is_some()
    }

    /// The token clients present, if any.
    pub fn token(&self) -> Option<&BearerToken> {
        self.token.as_ref()
    }

    /// Admits a request for `path` with this `Authorization` header value (absent: `None`).
    pub fn admit(&self, path: &str, authorization: Option<&[u8]>) -> Result<(), Unauthorized> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        if self.open.iter().any(|p| p.admits(path)) {
            return Ok(());
        }
        match authorization {
            Some(value) if token.presented_in(value) => Ok(()),
            Some(_) => Err(Unauthorized {
                message: format!(
                    "unauthorized: the bearer token is not the one in `{}`",
                    self.token_key
                ),
            }),
            None => Err(Unauthorized {
                message: format!(
                    "unauthorized: send `Authorization: Bearer TOKEN` with the token in `{}`",
                    self.token_key
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: AccessKeys = AccessKeys {
        section: "s",
        address: "address",
        token_file: "token_file",
        open_paths: "open_paths",
    };

    fn token_file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn loopback_without_a_token_admits_everything() {
        let a = Access::load(KEYS, "127.0.0.1:0".parse().unwrap(), None, &[]).unwrap();
        assert!(!a.requires_token());
        assert!(a.admit("/ui", None).is_ok());
        let v6 = Access::load(KEYS, "[::1]:80".parse().unwrap(), None, &[]).unwrap();
        assert!(v6.admit("/metrics", None).is_ok());
    }

    #[test]
    fn another_address_without_a_token_is_refused_naming_both_keys() {
        for addr in ["0.0.0.0:9464", "[::]:9464", "10.1.2.3:80"] {
            let e = check_exposure(KEYS, addr.parse().unwrap(), None, &[]).unwrap_err();
            assert_eq!(e.key, "address");
            assert!(e.message.contains("s.token_file"), "{e}");
            assert!(!e.to_string().contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn the_token_is_required_unless_the_path_is_open() {
        let f = token_file("0123456789abcdef0123\nignored\n");
        let open = vec!["/metrics".to_string(), "/ui/static/*".to_string()];
        let a = Access::load(KEYS, "0.0.0.0:0".parse().unwrap(), Some(f.path()), &open).unwrap();
        assert!(a.requires_token());
        let good = b"Bearer 0123456789abcdef0123".as_slice();
        assert!(a.admit("/ui", Some(good)).is_ok());
        assert!(a
            .admit("/ui", Some(b"Bearer  0123456789abcdef0123 "))
            .is_ok());
        let e = a.admit("/ui", None).unwrap_err();
        assert!(e.message.contains("s.token_file"));
        assert!(
            !e.message.contains("0123456789abcdef"),
            "never shows the token"
        );
        for wrong in [
            b"Bearer 0123456789abcdef012".as_slice(),
            b"Bearer 0123456789abcdef01234",
            b"Basic 0123456789abcdef0123",
            b"0123456789abcdef0123",
            b"Bearer ",
        ] {
            assert!(a.admit("/ui", Some(wrong)).is_err());
        }
        assert!(a.admit("/metrics", None).is_ok());
        assert!(
            a.admit("/metrics/x", None).is_err(),
            "exact paths are exact"
        );
        assert!(a.admit("/ui/static/app.js", None).is_ok());
        assert!(
            a.admit("/ui/static/../run", None).is_err(),
            "dot segments need it"
        );
        assert!(
            a.admit("/ui/static/%2e%2e/run", None).is_err(),
            "escapes need it"
        );
        assert!(a.admit("/ui/staticx", None).is_err());
    }

    #[test]
    fn bad_tokens_and_open_paths_are_refused_in_one_line() {
        let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
        for text in [
            "",
            "\n",
            "short",
            "has a space in it ok",
            "tab\tinside0123456789",
        ] {
            let f = token_file(text);
            let e = Access::load(KEYS, addr, Some(f.path()), &[]).unwrap_err();
            assert_eq!(e.key, "token_file", "{text:?}: {e}");
            assert!(e.message.contains(&f.path().display().to_string()));
        }
        let missing = Path::new("/nonexistent/token");
        let e = Access::load(KEYS, addr, Some(missing), &[]).unwrap_err();
        assert!(e.message.contains("/nonexistent/token"), "{e}");
        let f = token_file("0123456789abcdef0123");
        for bad in ["metrics", "/a/../b", "/a?x", "/a*", "/a/*/b", "/%2e"] {
            let e = Access::load(KEYS, addr, Some(f.path()), &[bad.into()]).unwrap_err();
            assert_eq!(e.key, "open_paths", "{bad}: {e}");
        }
        let e =
            check_exposure(KEYS, "127.0.0.1:0".parse().unwrap(), None, &["/m".into()]).unwrap_err();
        assert_eq!(e.key, "open_paths");
    }

    #[test]
    fn debug_hides_the_token() {
        let f = token_file("0123456789abcdef0123");
        let a = Access::load(KEYS, "0.0.0.0:0".parse().unwrap(), Some(f.path()), &[]).unwrap();
        assert!(!format!("{a:?}").contains("0123456789"));
    }
}

//! The Hugging Face hub's side of `hf://`: the endpoint and token from the environment, the resolve URLs, and a file's metadata from a HEAD that does not follow the redirect.

use std::fmt;
use std::path::{Path, PathBuf};

/// The public hub, where `HF_ENDPOINT` is unset.
pub(crate) const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A hub access token; never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Where the hub is and who asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubConfig {
    /// Scheme and host (and a path prefix for a mirror), no trailing slash.
    pub endpoint: String,
    pub token: Option<Token>,
}

impl HubConfig {
    /// From the process's environment and the token file the hub's tools write.
    pub(crate) fn from_env() -> Self {
        Self::from_vars(
            |name| std::env::var(name).ok(),
            |path| std::fs::read_to_string(path).ok(),
        )
    }

    /// From `var` and `read`, as the hub's own client does: `HF_ENDPOINT`, else the public
    /// hub; `HF_TOKEN`, else the file `HF_TOKEN_PATH`, else `$HF_HOME/token` (see
    /// `layout::hub_root` for `HF_HOME`). Empty values count as unset.
    pub(crate) fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        read: impl Fn(&Path) -> Option<String>,
    ) -> Self {
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let endpoint = set("HF_ENDPOINT")
            .map(|e| e.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let token_file = set("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
            let home = set("HF_HOME").map(PathBuf::from).or_else(|| {
                let cache = set("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| set("HOME").map(|h| Path::new(&h).join(".cache")))?;
                Some(cache.join("huggingface"))
            })?;
            Some(home.join("token"))
        });
        let token = set("HF_TOKEN")
            .or_else(|| {
                let text = read(token_file.as_deref()?)?;
                Some(text.trim().to_owned()).filter(|t| !t.is_empty())
            })
            .map(Token);
        HubConfig { endpoint, token }
    }

    /// `{endpoint}/{repo}/resolve/{revision}/`: a repository's base URL at a revision.
    pub(crate) fn resolve_base(&self, repo: &str, revision: &str) -> String {
        let revision = encode_segment(revision);
        format!("{}/{repo}/resolve/{revision}/", self.endpoint)
    }

    pub(crate) fn resolve_url(&self, repo: &str, revision: &str, file: &str) -> String {
        let path: Vec<String> = file.split('/').map(encode_segment).collect();
        format!("{}{}", self.resolve_base(repo, revision), path.join("/"))
    }
}

/// Percent-encodes one path segment (RFC 3986's unreserved characters kept): `refs%2Fpr%2F1`.
pub(crate) fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What the hub says of a file in the answer to a HEAD of its resolve URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HubFileMeta {
    /// `X-Repo-Commit`: the commit the revision resolved to.
    pub commit: Option<String>,
    /// `X-Linked-Etag`, unquoted: an LFS file's SHA-256 (hex), what `verify` can check.
    pub linked_etag: Option<String>,
    /// `X-Linked-Size`, else `Content-Length` of a direct answer.
    pub size: Option<u64>,
    /// Where a redirect leads (the CDN), if the answer was one.
    pub location: Option<String>,
}

impl HubFileMeta {
    /// Reads the headers of an answer of `status` (`header` looks one up, lowercase).
    pub(crate) fn from_headers(status: u16, header: impl Fn(&str) -> Option<String>) -> Self {
        let commit = header("x-repo-commit").filter(|c| is_commit(c));
        let linked_etag = header("x-linked-etag")
            .map(|e| unquote(&e))
            .filter(|e| !e.is_empty());
        let redirect = (300..400).contains(&status);
        let size = header("x-linked-size")
            .and_then(|s| s.trim().parse().ok())
            .or_else(|| {
                (!redirect)
                    .then(|| header("content-length"))
                    .flatten()
                    .and_then(|s| s.trim().parse().ok())
            });
        let location = header("location").filter(|_| redirect);
        HubFileMeta {
            commit,
            linked_etag,
            size,
            location,
        }
    }

    /// The SHA-256 the hub vouches for, where the linked ETag is one (an LFS file's).
    pub(crate) fn sha256(&self) -> Option<&str> {
        self.linked_etag
            .as_deref()
            .filter(|e| e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// An ETag without a weak `W/` and quotes, as the hub's client names a blob by it.
pub(crate) fn unquote(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_owned()
}

/// A full commit id: 40 hex digits.
pub(crate) fn is_commit(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)], files: &[(&str, &str)]) -> HubConfig {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let files: HashMap<PathBuf, String> = files
            .iter()
            .map(|(k, v)| (PathBuf::from(k), v.to_string()))
            .collect();
        HubConfig::from_vars(|k| vars.get(k).cloned(), |p| files.get(p).cloned())
    }

    #[test]
    fn endpoint_and_token_come_from_the_environment_then_the_token_file() {
        let public = config(&[("HOME", "/home/u")], &[]);
        assert_eq!(public.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(public.token, None);

        let home_file = config(
            &[
                ("HOME", "/home/u"),
                ("HF_ENDPOINT", "http://127.0.0.1:8080/"),
            ],
            &[("/home/u/.cache/huggingface/token", "hf_file\n")],
        );
        assert_eq!(home_file.endpoint, "http://127.0.0.1:8080");
        assert_eq!(home_file.token.unwrap().secret(), "hf_file");

        let files = [
            ("/hf/token", "hf_home"),
            ("/x/huggingface/token", "hf_xdg"),
            ("/t", "hf_path"),
        ];
        let hf_home = config(&[("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/x")], &files);
        assert_eq!(hf_home.token.unwrap().secret(), "hf_home");
        let xdg = config(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")], &files);
        assert_eq!(xdg.token.unwrap().secret(), "hf_xdg");
        let path = config(&[("HF_TOKEN_PATH", "/t"), ("HF_HOME", "/hf")], &files);
        assert_eq!(path.token.unwrap().secret(), "hf_path");
        let env = config(&[("HF_TOKEN", " hf_env "), ("HF_HOME", "/hf")], &files);
        assert_eq!(env.token.clone().unwrap().secret(), "hf_env");
        assert!(!format!("{env:?}").contains("hf_env"));
        let empty = config(
            &[("HF_TOKEN", ""), ("HF_HOME", "/none")],
            &[("/none/token", " \n")],
        );
        assert_eq!(empty.token, None);
    }

    #[test]
    fn resolve_urls_escape_revisions_and_paths() {
        let hub = config(&[("HF_ENDPOINT", "https://hub.example")], &[]);
        assert_eq!(
            hub.resolve_url("org/repo", "main", "sub dir/model.safetensors"),
            "https://hub.example/org/repo/resolve/main/sub%20dir/model.safetensors"
        );
        assert_eq!(
            hub.resolve_base("org/repo", "refs/pr/1"),
            "https://hub.example/org/repo/resolve/refs%2Fpr%2F1/"
        );
    }

    #[test]
    fn metadata_reads_the_hub_headers_of_a_redirect_and_of_a_direct_answer() {
        let sha = "a".repeat(64);
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let lfs: HashMap<&str, String> = [
            ("x-repo-commit", commit.to_owned()),
            ("x-linked-etag", format!("\"{sha}\"")),
            ("x-linked-size", "1234".to_owned()),
            ("content-length", "1351".to_owned()),
            ("location", "https://cdn.example/x".to_owned()),
        ]
        .into_iter()
        .collect();
        let meta = HubFileMeta::from_headers(302, |h| lfs.get(h).cloned());
        assert_eq!(meta.commit.as_deref(), Some(commit));
        assert_eq!(meta.sha256(), Some(sha.as_str()));
        assert_eq!(meta.size, Some(1234));
        assert_eq!(meta.location.as_deref(), Some("https://cdn.example/x"));

        let small: HashMap<&str, String> = [
            ("x-repo-commit", "not-a-commit".to_owned()),
            (
                "etag",
                "\"0123456789abcdef0123456789abcdef01234567\"".to_owned(),
            ),
            (
                "x-linked-etag",
                "W/\"0123456789abcdef0123456789abcdef01234567\"".to_owned(),
            ),
            ("content-length", "77".to_owned()),
            ("location", "ignored".to_owned()),
        ]
        .into_iter()
        .collect();
        let meta = HubFileMeta::from_headers(200, |h| small.get(h).cloned());
        assert_eq!(meta.commit, None);
        assert_eq!(meta.sha256(), None, "a git blob id is no SHA-256");
        assert_eq!(meta.size, Some(77));
        assert_eq!(meta.location, None);
    }
}

//! Remote checkpoint addresses (`s3://`, `gs://`, `az://`, `http(s)://`, `hf://`), parsed, and shown without credentials.

use std::fmt;

/// An object store reached through its own protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    /// `s3://` (and `s3a://`): Amazon S3 or any S3-compatible store.
    S3,
    /// `gs://`: Google Cloud Storage.
    Gcs,
    /// `az://` (and `abfs://`, `abfss://`): Azure Blob Storage.
    Azure,
}

impl StoreKind {
    fn scheme(self) -> &'static str {
        match self {
            StoreKind::S3 => "s3",
            StoreKind::Gcs => "gs",
            StoreKind::Azure => "az",
        }
    }
}

/// A parsed remote address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RemoteUrl {
    /// `s3://bucket/key`, `gs://bucket/key`, `az://container/key`: `key` may be empty, a
    /// prefix, or one object.
    Store {
        kind: StoreKind,
        bucket: String,
        key: String,
    },
    /// `http://` or `https://`: `base` is up to the last `/`, `name` what follows. The
    /// query (presigned URLs) is sent but never shown.
    Http {
        base: String,
        name: String,
        query: Option<String>,
    },
    /// `hf://org/repo[@revision][/subfolder][?with=name,...]`: a hub model repository, and
    /// other files to bring beside the weights (`engine` stands for [`ENGINE_FILES`]).
    Hub {
        repo: String,
        revision: Option<String>,
        subfolder: String,
        with: Vec<String>,
    },
}

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UrlError {
    /// What is wrong, in words (never the address's credentials).
    pub reason: &'static str,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason)
    }
}

fn refuse<T>(reason: &'static str) -> Result<T, UrlError> {
    Err(UrlError { reason })
}

impl RemoteUrl {
    /// Parses an address; a local path (no known scheme) is an error here.
    pub(crate) fn parse(text: &str) -> Result<RemoteUrl, UrlError> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return refuse("not a URL (no scheme://)");
        };
        if text.chars().any(|c| c.is_control() || c == ' ') {
            return refuse("a URL may not contain spaces or control characters");
        }
        let kind = match scheme.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => StoreKind::S3,
            "gs" => StoreKind::Gcs,
            "az" | "abfs" | "abfss" => StoreKind::Azure,
            "http" | "https" => return parse_http(scheme, rest),
            "hf" => return parse_hub(rest),
            _ => return refuse("unknown scheme (s3, gs, az, http, https, hf)"),
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return refuse("no bucket name");
        }
        // `user@bucket` would be Azure's container@account form, and credentials otherwise.
        if bucket.contains(['@', ':', '?', '#']) {
            return refuse("a bucket name may not contain @, :, ? or #");
        }
        check_key(key)?;
        Ok(RemoteUrl::Store {
            kind,
            bucket: bucket.to_owned(),
            key: key.trim_end_matches('/').to_owned(),
        })
    }

    /// Whether the address names one `.safetensors` file or an index.
    pub(crate) fn names_file(&self) -> bool {
        let last = match self {
            RemoteUrl::Store { key, .. } => key.rsplit('/').next().unwrap_or_default(),
            RemoteUrl::Http { name, .. } => name.as_str(),
            RemoteUrl::Hub { .. } => return false,
        };
        last.ends_with(".safetensors") || last.ends_with(".json")
    }
}

/// Keys are object names: no empty, `.` or `..` segment in the middle (it would leave the prefix).
fn check_key(key: &str) -> Result<(), UrlError> {
    let key = key.trim_end_matches('/');
    if key.is_empty() {
        return Ok(());
    }
    if key
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return refuse("an object key may not have empty, . or .. segments");
    }
    Ok(())
}

fn parse_http(scheme: &str, rest: &str) -> Result<RemoteUrl, UrlError> {
    // A fragment is never sent.
    let rest = rest.split('#').next().unwrap_or_default();
    let (rest, query) = rest
        .split_once('?')
        .map_or((rest, None), |(rest, query)| (rest, Some(query.to_owned())));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return refuse("no host");
    }
    let (base_path, name) = path.rsplit_once('/').unwrap_or(("", path));
    let base = if base_path.is_empty() {
        format!("{}://{authority}/", scheme.to_ascii_lowercase())
    } else {
        format!("{}://{authority}/{base_path}/", scheme.to_ascii_lowercase())
    };
    Ok(RemoteUrl::Http {
        base,
        name: name.to_owned(),
        query,
    })
}

/// Whether `name` is an org or repository name the hub takes: 1 to 96 of letters, digits,
/// `-`, `_` and `.`, no `--` or `..` (`models--org--name` must name one address), not
/// starting or ending with `-` or `.`.
pub(crate) fn hub_name_ok(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c != '-' && c != '.');
    (1..=96).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.contains("--")
        && !name.contains("..")
        && edge(name.chars().next())
        && edge(name.chars().last())
}

/// Why a name [`hub_name_ok`] refuses is refused.
pub(crate) const HUB_NAME_RULE: &str = "hf:// org and repo names are 1 to 96 letters, digits, \
    -, _ and ., with no -- or .. and neither starting nor ending with - or .";

/// Why a revision [`hub_revision_ok`] refuses is refused.
pub(crate) const HUB_REVISION_RULE: &str =
    "a bad hf:// revision: plain /-separated names (no empty, . or .. name), none of %?#@";

/// Whether `revision` (`%2F` decoded) is one `hf://` takes: plain `/`-separated names,
/// none of `%?#@`, so that it names no path outside `refs/` nor another URL of the hub.
pub(crate) fn hub_revision_ok(revision: &str) -> bool {
    !revision.contains(['%', '?', '#', '@'])
        && revision
            .split('/')
            .all(|n| !n.is_empty() && n != "." && n != ".." && !n.contains(['\\', '\0']))
}

/// A refused address as errors show it: `hf://` as given, any other without query or
/// fragment and without anything up to its last `@` (a password, even one with a `/`).
pub(crate) fn shown_refused(text: &str) -> String {
    if text
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("hf://"))
    {
        return text.to_owned();
    }
    let bare = text.split(['?', '#']).next().unwrap_or_default();
    match bare.split_once("://") {
        Some((scheme, rest)) => {
            let host_on = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
            format!("{scheme}://{host_on}")
        }
        None => bare.to_owned(),
    }
}

/// The files `?with=engine` brings: what an engine reads beside the weights.
pub(crate) const ENGINE_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
];

/// The names of `?with=a,b,engine`: each a plain repository path, `engine` expanded, each once.
fn parse_with(query: Option<&str>) -> Result<Vec<String>, UrlError> {
    let Some(query) = query else {
        return Ok(Vec::new());
    };
    let Some(list) = query.strip_prefix("with=") else {
        return refuse("hf:// takes one option, ?with=engine or ?with=name,name");
    };
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',') {
        let expanded = match name {
            "engine" => ENGINE_FILES.to_vec(),
            _ => vec![name],
        };
        for name in expanded {
            let ok = !name.is_empty()
                && !name.contains(['\\', '?', '#', '&', '='])
                && name
                    .split('/')
                    .all(|p| !p.is_empty() && p != "." && p != "..");
            if !ok {
                return refuse("a bad file name in hf://...?with=");
            }
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }
    Ok(names)
}

/// `org/repo[@revision][/subfolder][?with=...]`; a revision's slashes written `%2F`.
fn parse_hub(rest: &str) -> Result<RemoteUrl, UrlError> {
    let (rest, query) = rest
        .split_once('?')
        .map_or((rest, None), |(r, q)| (r, Some(q)));
    let with = parse_with(query)?;
    let mut parts = rest.trim_end_matches('/').splitn(3, '/');
    let (Some(org), Some(repo_rev)) = (parts.next(), parts.next()) else {
        return refuse("hf:// needs org/repo");
    };
    let subfolder = parts.next().unwrap_or_default();
    let (repo, revision) = repo_rev
        .split_once('@')
        .map_or((repo_rev, None), |(repo, rev)| (repo, Some(rev)));
    if !hub_name_ok(org) || !hub_name_ok(repo) {
        return refuse(HUB_NAME_RULE);
    }
    let revision = revision.map(|rev| rev.replace("%2F", "/").replace("%2f", "/"));
    if revision.as_deref().is_some_and(|rev| !hub_revision_ok(rev)) {
        return refuse(HUB_REVISION_RULE);
    }
    check_key(subfolder)?;
    Ok(RemoteUrl::Hub {
        repo: format!("{org}/{repo}"),
        revision,
        subfolder: subfolder.to_owned(),
        with,
    })
}

impl fmt::Display for RemoteUrl {
    /// The address as reports and errors show it: no user information, no query.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteUrl::Store { kind, bucket, key } => {
                write!(f, "{}://{bucket}", kind.scheme())?;
                if !key.is_empty() {
                    write!(f, "/{key}")?;
                }
                Ok(())
            }
            RemoteUrl::Http { base, name, .. } => write!(f, "{}{name}", without_userinfo(base)),
            RemoteUrl::Hub {
                repo,
                revision,
                subfolder,
                ..
            } => {
                write!(f, "hf://{repo}")?;
                if let Some(rev) = revision {
                    write!(f, "@{}", rev.replace('/', "%2F"))?;
                }
                if !subfolder.is_empty() {
                    write!(f, "/{subfolder}")?;
                }
                Ok(())
            }
        }
    }
}

/// `scheme://user:pass@host/...` without `user:pass@`.
pub(crate) fn without_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(kind: StoreKind, bucket: &str, key: &str) -> RemoteUrl {
        RemoteUrl::Store {
            kind,
            bucket: bucket.into(),
            key: key.into(),
        }
    }

    #[test]
    fn store_urls_name_a_bucket_and_a_key_or_prefix() {
        let cases = [
            (
                "s3://bucket/models/llama",
                store(StoreKind::S3, "bucket", "models/llama"),
            ),
            (
                "s3://bucket/models/llama/",
                store(StoreKind::S3, "bucket", "models/llama"),
            ),
            (
                "S3A://b/k.safetensors",
                store(StoreKind::S3, "b", "k.safetensors"),
            ),
            ("s3://bucket", store(StoreKind::S3, "bucket", "")),
            (
                "gs://b/x/model.safetensors",
                store(StoreKind::Gcs, "b", "x/model.safetensors"),
            ),
            (
                "az://container/p",
                store(StoreKind::Azure, "container", "p"),
            ),
            (
                "abfss://container/p",
                store(StoreKind::Azure, "container", "p"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(RemoteUrl::parse(text), Ok(want), "{text}");
        }
        let file = RemoteUrl::parse("s3://b/m/model.safetensors").unwrap();
        assert!(file.names_file());
        assert!(!RemoteUrl::parse("s3://b/m").unwrap().names_file());
        assert!(
            RemoteUrl::parse("gs://b/model.safetensors.index.json")
                .unwrap()
                .names_file()
        );
        assert_eq!(file.to_string(), "s3://b/m/model.safetensors");
    }

    #[test]
    fn bad_addresses_are_refused_with_a_reason() {
        for bad in [
            "model.safetensors",
            "/abs/path",
            "ftp://host/x",
            "s3://",
            "s3:///key",
            "s3://b/a//c",
            "s3://b/../c",
            "s3://key:secret@bucket/x",
            "gs://b/a b",
            "http:///x",
            "hf://",
            "hf://org",
            "hf://org/",
            "hf://org/re po",
            "hf://../repo",
            "hf://org/repo--x",
            "hf://org--repo/x",
            "hf://org/-repo",
            "hf://org/repo.",
            "hf://.org/repo",
            "hf://org/re..po",
            "hf://org/repo@",
            "hf://org/repo@a%zz",
            "hf://org/repo/sub/../x",
            "hf://a/b/../c",
            "hf://org/repo@..",
            "hf://org/repo@refs%2F..%2F..%2Fx",
            "hf://org/repo@refs%2F%2Fpr",
            "hf://org/repo@main%2F",
        ] {
            let err = RemoteUrl::parse(bad).unwrap_err();
            assert!(!err.reason.is_empty(), "{bad}");
            // The reason never repeats the address (it may hold credentials).
            assert!(!err.to_string().contains("secret"), "{bad}");
        }
    }

    #[test]
    fn a_refused_address_is_shown_without_credentials() {
        for (text, shown) in [
            ("hf://acme/bad--name", "hf://acme/bad--name"),
            ("hf://org/m?with=../x", "hf://org/m?with=../x"),
            ("s3://key:secret@bucket/x", "s3://bucket/x"),
            ("https://u:pa/ss@host/a b?sig=secret#f", "https://host/a b"),
            ("gs://b/a b", "gs://b/a b"),
            ("not an address", "not an address"),
        ] {
            assert_eq!(shown_refused(text), shown, "{text}");
        }
    }

    #[test]
    fn revisions_are_plain_names() {
        for good in ["main", "v1.0", "refs/pr/1", &"ab".repeat(20)] {
            assert!(hub_revision_ok(good), "{good}");
        }
        for bad in [
            "", "..", "a/../b", "/main", "main/", "a//b", "a%2Fb", "a@b", "a\\b",
        ] {
            assert!(!hub_revision_ok(bad), "{bad}");
        }
    }

    #[test]
    fn hub_urls_take_a_revision_and_a_subfolder() {
        let hub = |repo: &str, revision: Option<&str>, subfolder: &str| RemoteUrl::Hub {
            repo: repo.into(),
            revision: revision.map(Into::into),
            subfolder: subfolder.into(),
            with: Vec::new(),
        };
        let cases = [
            ("hf://org/repo", hub("org/repo", None, "")),
            ("hf://org/repo/", hub("org/repo", None, "")),
            ("hf://org/repo@main", hub("org/repo", Some("main"), "")),
            (
                "hf://org/repo@v1.0/sub/dir",
                hub("org/repo", Some("v1.0"), "sub/dir"),
            ),
            ("hf://org/repo/unet", hub("org/repo", None, "unet")),
            (
                "hf://org/repo@refs%2Fpr%2F1",
                hub("org/repo", Some("refs/pr/1"), ""),
            ),
            ("hf://Org-1/Repo_2.5", hub("Org-1/Repo_2.5", None, "")),
        ];
        for (text, want) in cases {
            let got = RemoteUrl::parse(text).unwrap();
            assert_eq!(got, want, "{text}");
            assert!(!got.names_file());
        }
        let shown = RemoteUrl::parse("hf://org/repo@refs%2Fpr%2F1/sub").unwrap();
        assert_eq!(shown.to_string(), "hf://org/repo@refs%2Fpr%2F1/sub");
    }

    #[test]
    fn hub_urls_name_the_other_files_to_bring_and_refuse_bad_names() {
        let with = |text: &str| match RemoteUrl::parse(text) {
            Ok(RemoteUrl::Hub { with, .. }) => Ok(with),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.reason),
        };
        assert_eq!(
            with("hf://org/repo@main/sub?with=engine").unwrap(),
            ENGINE_FILES
        );
        assert_eq!(
            with("hf://org/repo?with=vocab.txt,config.json,engine").unwrap()[..3],
            ["vocab.txt", "config.json", "generation_config.json"]
        );
        assert_eq!(with("hf://org/repo?with=a/b.json").unwrap(), ["a/b.json"]);
        for bad in [
            "?with=",
            "?with=../x",
            "?with=a//b",
            "?with=./a",
            "?files=x",
            "?with=a&b=c",
        ] {
            assert!(with(&format!("hf://org/repo{bad}")).is_err(), "{bad}");
        }
        // The address shown has no option.
        let url = RemoteUrl::parse("hf://org/repo@v1?with=engine").unwrap();
        assert_eq!(url.to_string(), "hf://org/repo@v1");
    }

    #[test]
    fn http_urls_are_shown_without_credentials() {
        let url = RemoteUrl::parse(
            "https://user:pw@host:8080/a/b/model.safetensors?X-Amz-Signature=abc#frag",
        )
        .unwrap();
        assert_eq!(
            url,
            RemoteUrl::Http {
                base: "https://user:pw@host:8080/a/b/".into(),
                name: "model.safetensors".into(),
                query: Some("X-Amz-Signature=abc".into()),
            }
        );
        assert!(url.names_file());
        assert_eq!(url.to_string(), "https://host:8080/a/b/model.safetensors");
        let dir = RemoteUrl::parse("http://127.0.0.1:9/ckpt/").unwrap();
        assert_eq!(dir.to_string(), "http://127.0.0.1:9/ckpt/");
        assert!(!dir.names_file());
        assert_eq!(
            RemoteUrl::parse("http://h").unwrap().to_string(),
            "http://h/"
        );
    }
}

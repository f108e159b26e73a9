//! The caches' layouts as names, without I/O: where the Hugging Face cache is and what its names are (repository folder, blobs, snapshot links, refs, `.no_exist` markers, locks, process-unique temporary names), the switches, and the names of the cache directory of other stores.
//!
//! The hub cache's layout is its own client's (`file_download.py`):
//!
//! ```text
//! <cache>/models--org--repo/blobs/<etag>                  the bytes (an LFS file's SHA-256, else its git blob id)
//!                          /snapshots/<commit>/<path>     -> ../../blobs/<etag>, one ../ more per folder of <path>
//!                          /refs/<revision>               <commit>
//!                          /.no_exist/<commit>/<path>     empty: <path> does not exist at <commit>
//! <cache>/.locks/models--org--repo/<etag>.lock
//! <cache>/blobs/<h[0..2]>/<h>                             the shared store a repository's blob may link to
//! ```

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::verify::hex_into;

/// `0` (or `false`, `no`, `off`) turns the hub cache off (`Loader::hub_cache` overrides).
pub(crate) const HUB_CACHE_ENV: &str = "SAFELOAD_HUB_CACHE";
/// The cache directory of other stores, where the load names none (`Loader::cache_dir`).
pub(crate) const CACHE_DIR_ENV: &str = "SAFELOAD_CACHE_DIR";
/// The folder of the cache directory that holds this crate's entries.
pub(crate) const OBJECTS_FOLDER: &str = "safeload-objects";
/// The file of an object's folder that holds its address, for listings.
pub(crate) const ADDRESS_FILE: &str = "address";
/// The hub's shared blob store marks itself with this file holding `1\n`.
pub(crate) const SHARED_STORE_MARKER: &str = ".huggingface-shared-blobs";

/// A variable's value, empty counted as unset.
fn set(var: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    var(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// `~` or `~/x` with the home directory.
fn expand_home(value: String, var: &impl Fn(&str) -> Option<String>) -> PathBuf {
    match value.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match set(var, "HOME") {
            Some(home) => PathBuf::from(format!("{home}{rest}")),
            None => PathBuf::from(value),
        },
        _ => PathBuf::from(value),
    }
}

/// Where the hub cache is, as the hub's client finds it: `HF_HUB_CACHE`, else
/// `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub` (`HF_HOME` defaulting to
/// `$XDG_CACHE_HOME/huggingface`, then `~/.cache/huggingface`). `None` without `HOME`.
pub(crate) fn hub_root(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(dir) = set(&var, "HF_HUB_CACHE").or_else(|| set(&var, "HUGGINGFACE_HUB_CACHE")) {
        return Some(expand_home(dir, &var));
    }
    let home = match set(&var, "HF_HOME") {
        Some(home) => expand_home(home, &var),
        None => {
            let cache = match set(&var, "XDG_CACHE_HOME") {
                Some(cache) => expand_home(cache, &var),
                None => PathBuf::from(set(&var, "HOME")?).join(".cache"),
            };
            cache.join("huggingface")
        }
    };
    Some(home.join("hub"))
}

/// `HF_HUB_OFFLINE` (else `TRANSFORMERS_OFFLINE`) set, as the hub's client reads it.
pub(crate) fn offline(var: impl Fn(&str) -> Option<String>) -> bool {
    let value = var("HF_HUB_OFFLINE")
        .filter(|v| !v.is_empty())
        .or_else(|| var("TRANSFORMERS_OFFLINE"));
    value.as_deref().and_then(crate::policy::switch) == Some(true)
}

/// Whether `hf://` goes through the hub cache: the caller's choice, else
/// `SAFELOAD_HUB_CACHE`, else on.
pub(crate) fn hub_cache_on(caller: Option<bool>, var: impl Fn(&str) -> Option<String>) -> bool {
    caller.unwrap_or_else(|| {
        var(HUB_CACHE_ENV)
            .as_deref()
            .and_then(crate::policy::switch)
            != Some(false)
    })
}

/// The cache directory of other stores: the caller's, else `SAFELOAD_CACHE_DIR`.
pub(crate) fn store_cache_dir(
    caller: Option<&Path>,
    var: impl Fn(&str) -> Option<String>,
) -> Option<PathBuf> {
    caller
        .map(Path::to_path_buf)
        .or_else(|| set(&var, CACHE_DIR_ENV).map(|d| expand_home(d, &var)))
}

/// A repository's folder: `models--org--repo`.
pub(crate) fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// Whether `name` can be one name of a cache path (not `.`, `..`, no separator or NUL).
pub(crate) fn is_plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// The names of a `/`-separated cache path; `None` where one is not plain.
pub(crate) fn names(path: &str) -> Option<Vec<&str>> {
    let names: Vec<&str> = path.split('/').collect();
    names.iter().all(|n| is_plain(n)).then_some(names)
}

/// A full commit id as a snapshot folder is named: 40 lowercase hex digits.
pub(crate) fn commit_name(text: &str) -> Option<String> {
    (text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| text.to_ascii_lowercase())
}

/// The commit a ref file holds (its whole text, a newline allowed).
pub(crate) fn commit_of_ref(text: &str) -> Option<String> {
    commit_name(text.trim_end())
}

/// What a blob's name says its bytes hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Named {
    /// 64 hex digits: an LFS file's SHA-256.
    Sha256([u8; 32]),
    /// 40 hex digits: a small file's git blob id.
    GitBlob([u8; 20]),
}

/// What the blob name `name` vouches for, where it is a digest.
pub(crate) fn named_digest(name: &str) -> Option<Named> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut sha = [0u8; 32];
    if hex_into(name, &mut sha) {
        return Some(Named::Sha256(sha));
    }
    let mut git = [0u8; 20];
    hex_into(name, &mut git).then_some(Named::GitBlob(git))
}

pub(crate) use crate::remote::hub::unquote as blob_name_of_etag;

/// The link a snapshot file `depth` folders deep makes to `blob`.
pub(crate) fn snapshot_link(depth: usize, blob: &str) -> String {
    format!("{}blobs/{blob}", "../".repeat(2 + depth))
}

/// The blob a snapshot link names: relative as the hub's client writes it
/// ([`snapshot_link`]), or absolute under `repo_dir`; `None` for another link.
pub(crate) fn blob_of_link(target: &Path, depth: usize, repo_dir: &Path) -> Option<String> {
    let rest = if target.is_absolute() {
        target.strip_prefix(repo_dir.join("blobs")).ok()?
    } else {
        let mut components = target.components();
        for _ in 0..2 + depth {
            if components.next() != Some(Component::ParentDir) {
                return None;
            }
        }
        match components.next() {
            Some(Component::Normal(blobs)) if blobs == "blobs" => components.as_path(),
            _ => return None,
        }
    };
    let mut names = rest.components();
    match (names.next(), names.next()) {
        (Some(Component::Normal(name)), None) => {
            name.to_str().filter(|n| is_plain(n)).map(str::to_owned)
        }
        _ => None,
    }
}

/// The shared blob store's entry a repository's blob links to
/// (`../../blobs/<h[0..2]>/<h>`): `(prefix, h)`.
pub(crate) fn shared_blob_of_link(target: &Path) -> Option<(String, String)> {
    let text = target.to_str()?;
    let rest = text.strip_prefix("../../blobs/")?;
    let (prefix, hash) = rest.split_once('/')?;
    let ok = hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && hash.get(..2) == Some(prefix);
    ok.then(|| (prefix.to_owned(), hash.to_owned()))
}

const TEMP_SUFFIX: &str = ".incomplete";

/// A process-unique temporary name for `final_name`: `<final_name>.<nonce>.incomplete`.
pub(crate) fn temp_name(final_name: &str, nonce: u64) -> String {
    format!("{final_name}.{nonce:016x}{TEMP_SUFFIX}")
}

/// Whether `name` is a temporary name a sweep may remove once its writer is gone
/// ([`temp_name`]'s, the hub client's, a kept partial file or its record).
pub(crate) fn is_temp_name(name: &str) -> bool {
    final_of_temp(name).is_some()
}

/// The final name a temporary name ([`is_temp_name`]) is written for.
pub(crate) fn final_of_temp(name: &str) -> Option<&str> {
    if let Some(last) = super::partial::final_of(name).filter(|n| is_plain(n)) {
        return Some(last);
    }
    let (base, nonce) = name.strip_suffix(TEMP_SUFFIX)?.rsplit_once('.')?;
    let nonce_ok = (8..=32).contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    (is_plain(base) && nonce_ok).then_some(base)
}

/// The lock file of a final name: a blob's in `.locks/<repo folder>/`, an object's beside it.
pub(crate) fn lock_name(blob: &str) -> String {
    format!("{blob}.lock")
}

/// Hex of the first 16 bytes of the SHA-256 of `text`: a name that stays in its folder.
fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    crate::verify::hex(digest.get(..16).unwrap_or_default())
}

/// The folder of an object's versions in a cache directory.
pub(crate) fn object_folder(address: &str) -> String {
    short_hash(address)
}

/// An object version's file name: its length and ETag (a replaced object gets another).
pub(crate) fn object_version(len: u64, etag: &str) -> String {
    format!("{len}-{}", short_hash(etag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn the_hub_cache_is_found_as_the_hubs_client_finds_it() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case<'_>] = &[
            (
                &[("HOME", "/home/u")],
                Some("/home/u/.cache/huggingface/hub"),
            ),
            (
                &[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")],
                Some("/x/huggingface/hub"),
            ),
            (
                &[
                    ("HOME", "/home/u"),
                    ("XDG_CACHE_HOME", "/x"),
                    ("HF_HOME", "/hf"),
                ],
                Some("/hf/hub"),
            ),
            (
                &[("HOME", "/home/u"), ("HF_HOME", "~/hf")],
                Some("/home/u/hf/hub"),
            ),
            (
                &[("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/legacy")],
                Some("/legacy"),
            ),
            (
                &[
                    ("HF_HUB_CACHE", "/c"),
                    ("HUGGINGFACE_HUB_CACHE", "/legacy"),
                    ("HF_HOME", "/hf"),
                ],
                Some("/c"),
            ),
            (
                &[("HF_HUB_CACHE", " "), ("HF_HOME", "/hf")],
                Some("/hf/hub"),
            ),
            (&[], None),
        ];
        for (vars, want) in cases {
            assert_eq!(hub_root(env(vars)), want.map(PathBuf::from), "{vars:?}");
        }
    }

    #[test]
    fn switches_read_as_the_hub_and_the_crate_read_them() {
        for (vars, want) in [
            (&[][..], false),
            (&[("HF_HUB_OFFLINE", "1")][..], true),
            (&[("HF_HUB_OFFLINE", "True")][..], true),
            (&[("HF_HUB_OFFLINE", "yes")][..], true),
            (&[("HF_HUB_OFFLINE", "0")][..], false),
            (&[("HF_HUB_OFFLINE", "")][..], false),
            (&[("TRANSFORMERS_OFFLINE", "1")][..], true),
            (
                &[("HF_HUB_OFFLINE", "0"), ("TRANSFORMERS_OFFLINE", "1")][..],
                false,
            ),
        ] {
            assert_eq!(offline(env(vars)), want, "{vars:?}");
        }
        assert!(hub_cache_on(None, env(&[])));
        assert!(!hub_cache_on(None, env(&[(HUB_CACHE_ENV, "0")])));
        assert!(!hub_cache_on(None, env(&[(HUB_CACHE_ENV, " Off ")])));
        assert!(hub_cache_on(None, env(&[(HUB_CACHE_ENV, "1")])));
        assert!(hub_cache_on(Some(true), env(&[(HUB_CACHE_ENV, "0")])));
        assert!(!hub_cache_on(Some(false), env(&[])));
        let dir = Path::new("/mine");
        assert_eq!(store_cache_dir(None, env(&[])), None);
        assert_eq!(
            store_cache_dir(None, env(&[(CACHE_DIR_ENV, "/c")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            store_cache_dir(Some(dir), env(&[(CACHE_DIR_ENV, "/c")])),
            Some(dir.to_path_buf())
        );
    }

    #[test]
    fn names_of_repositories_commits_refs_and_blobs() {
        assert_eq!(repo_folder("org/model"), "models--org--model");
        assert_eq!(
            names("sub/dir/m.safetensors"),
            Some(vec!["sub", "dir", "m.safetensors"])
        );
        assert_eq!(names("refs/pr/1"), Some(vec!["refs", "pr", "1"]));
        for bad in ["", "a//b", "../x", "a/./b", "a\\b", "/abs", "a/", "a\0b"] {
            assert_eq!(names(bad), None, "{bad:?}");
        }
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(commit_name(&commit.to_uppercase()).as_deref(), Some(commit));
        assert_eq!(
            commit_of_ref(&format!("{commit}\n")).as_deref(),
            Some(commit)
        );
        for bad in [
            "main",
            "",
            &commit[1..],
            &format!("{commit}0"),
            "../../etc/passwd",
        ] {
            assert_eq!(commit_of_ref(bad), None, "{bad:?}");
        }
        let sha = "ab".repeat(32);
        assert_eq!(named_digest(&sha), Some(Named::Sha256([0xab; 32])));
        assert_eq!(
            named_digest(&"cd".repeat(20)),
            Some(Named::GitBlob([0xcd; 20]))
        );
        for bad in [
            "",
            "model",
            &"AB".repeat(32),
            &"ab".repeat(31),
            &"zz".repeat(32),
        ] {
            assert_eq!(named_digest(bad), None, "{bad:?}");
        }
        assert_eq!(blob_name_of_etag(&format!("W/\"{sha}\"")), sha);
        assert_eq!(blob_name_of_etag(&format!("\"{sha}\"")), sha);
    }

    #[test]
    fn snapshot_links_lead_to_the_repositorys_blobs_only() {
        let repo = Path::new("/c/models--o--m");
        assert_eq!(snapshot_link(0, "abc"), "../../blobs/abc");
        assert_eq!(snapshot_link(2, "abc"), "../../../../blobs/abc");
        let cases: &[(&str, usize, Option<&str>)] = &[
            ("../../blobs/abc", 0, Some("abc")),
            ("../../../blobs/abc", 1, Some("abc")),
            ("/c/models--o--m/blobs/abc", 0, Some("abc")),
            ("/c/models--o--m/blobs/abc", 3, Some("abc")),
            // One level short or long: another folder than the repository's blobs.
            ("../../blobs/abc", 1, None),
            ("../../../blobs/abc", 0, None),
            ("../../blobs/sub/abc", 0, None),
            ("../../blobs/..", 0, None),
            ("../../other/abc", 0, None),
            ("/etc/passwd", 0, None),
            ("/c/models--o--other/blobs/abc", 0, None),
            ("/c/models--o--m/blobs/../../x", 0, None),
            ("abc", 0, None),
            ("../../blobs/", 0, None),
        ];
        for (link, depth, want) in cases {
            assert_eq!(
                blob_of_link(Path::new(link), *depth, repo).as_deref(),
                *want,
                "{link} at {depth}"
            );
        }
        let h = "0a".repeat(32);
        assert_eq!(
            shared_blob_of_link(Path::new(&format!("../../blobs/0a/{h}"))),
            Some(("0a".to_owned(), h.clone()))
        );
        for bad in [
            format!("../../blobs/0b/{h}"),
            format!("../../blobs/0a/{}", h.to_uppercase()),
            format!("../../../blobs/0a/{h}"),
            format!("/c/blobs/0a/{h}"),
            format!("../../blobs/0a/{h}/x"),
            "../../blobs/0a/..".to_owned(),
        ] {
            assert_eq!(shared_blob_of_link(Path::new(&bad)), None, "{bad}");
        }
    }

    #[test]
    fn temporary_names_are_told_apart() {
        let blob = "ab".repeat(32);
        let temp = temp_name(&blob, 0x1234);
        assert_eq!(temp, format!("{blob}.0000000000001234.incomplete"));
        assert!(is_temp_name(&temp));
        // The hub client's own.
        assert!(is_temp_name(&format!("{blob}.deadbeef.incomplete")));
        // A partial file kept for a later load, and its record.
        assert!(is_temp_name(&format!("{blob}.safeload-partial")));
        assert!(is_temp_name(&format!("{blob}.safeload-pieces")));
        for not in [
            blob.clone(),
            format!("{blob}.incomplete"),
            format!("{blob}.xyz12345.incomplete"),
            format!("{blob}.1234.incomplete"),
            ".deadbeef.incomplete".to_owned(),
            ".safeload-partial".to_owned(),
        ] {
            assert!(!is_temp_name(&not), "{not}");
            assert_eq!(final_of_temp(&not), None, "{not}");
        }
        assert_eq!(lock_name("x"), "x.lock");
        // Each leads back to the name it is written for, dots and all (its
        // lock's name).
        let name = "model-00001-of-00002.safetensors";
        for temp in [
            temp_name(name, 7),
            format!("{name}.safeload-partial"),
            format!("{name}.safeload-pieces"),
        ] {
            assert_eq!(final_of_temp(&temp), Some(name), "{temp}");
        }
        assert_eq!(final_of_temp(&temp), Some(blob.as_str()));
    }

    #[test]
    fn objects_are_named_by_address_length_and_etag() {
        let a = object_folder("s3://b/m/model.safetensors");
        assert_eq!(a.len(), 32);
        assert!(is_plain(&a));
        assert_ne!(a, object_folder("s3://b/m/model-2.safetensors"));
        let v = object_version(10, "\"e1\"");
        assert!(v.starts_with("10-") && is_plain(&v), "{v}");
        assert_ne!(v, object_version(10, "\"e2\""));
        assert_ne!(v, object_version(11, "\"e1\""));
    }
}

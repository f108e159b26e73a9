//! The hub API's two answers that `huggingface_hub`'s `snapshot_download` asks for before it
//! downloads: a repository at a revision (its commit, `sha`, and its files, `siblings`) and its
//! file tree (sizes, git blob ids, LFS digests), built from the served directory.

use std::time::Instant;

use serde_json::{Value, json};

use crate::Shared;
use crate::objects::Object;

/// Whether the hub route answers the file at `path` as a small file kept in git (no LFS
/// metadata, its git blob id for ETag), as the hub does for JSON files, rather than as an
/// LFS file (its SHA-256 for ETag and `X-Linked-Etag`).
pub(crate) fn is_small(path: &str) -> bool {
    path.ends_with(".json")
}

/// The body of `/api/models/{repo}/revision|tree/{revision}`; `None` for a revision the
/// server does not have.
pub(crate) fn body(shared: &Shared, repo: &str, revision: &str, tree: bool) -> Option<Vec<u8>> {
    let options = &shared.options;
    let known = revision == options.commit || options.branches.iter().any(|b| b == revision);
    if !known {
        return None;
    }
    let now = Instant::now();
    let files: Vec<(String, Object)> = shared
        .objects
        .paths()
        .into_iter()
        .filter_map(|p| shared.objects.get(&p, now).map(|o| (p, o)))
        .collect();
    let value = if tree {
        Value::Array(
            files
                .iter()
                .map(|(path, object)| {
                    let mut entry = json!({
                        "type": "file",
                        "path": path,
                        "size": object.len,
                        "oid": object.git_oid,
                    });
                    if !is_small(path) {
                        entry["lfs"] = json!({
                            "oid": object.sha256,
                            "size": object.len,
                            "pointerSize": 134,
                        });
                    }
                    entry
                })
                .collect(),
        )
    } else {
        json!({
            "id": repo,
            "modelId": repo,
            "sha": options.commit,
            "private": false,
            "siblings": files.iter().map(|(p, _)| json!({ "rfilename": p })).collect::<Vec<_>>(),
        })
    };
    serde_json::to_vec(&value).ok()
}

//! `safeload cache`: what the Hugging Face cache holds for a repository (or every one), or where it is; `cache rm` and `cache prune` remove from it.

use safeload::hub::{CacheRemoval, RemoveMode};

use crate::args::{CacheAction, CacheArgs, CachePruneArgs, CacheRmArgs};
use crate::failure::Failure;
use crate::output;

/// Runs `safeload cache`, `safeload cache rm` or `safeload cache prune`.
pub fn run(args: &CacheArgs) -> Result<(), Failure> {
    match &args.action {
        Some(CacheAction::Rm(rm)) => remove(rm),
        Some(CacheAction::Prune(prune)) => prune_cache(prune),
        None => list(args),
    }
}

fn list(args: &CacheArgs) -> Result<(), Failure> {
    let listing = safeload::hub::hub_cache(args.repo.as_deref());
    if args.json {
        return output::json(&listing);
    }
    let mut text = listing.to_string();
    if let Some(repo) = &args.repo {
        if listing.repos.is_empty() {
            text.push_str(&format!("{repo}: nothing cached\n"));
        }
    }
    output::text(&text)
}

fn mode(dry_run: bool) -> RemoveMode {
    if dry_run {
        RemoveMode::DryRun
    } else {
        RemoveMode::Remove
    }
}

/// `REPO[@REVISION]`: a revision with slashes may be written escaped
/// (`refs%2Fpr%2F1`), as in an `hf://` address.
fn split_target(target: &str) -> (&str, Option<String>) {
    match target.split_once('@') {
        Some((repo, revision)) => {
            let revision = revision.replace("%2F", "/").replace("%2f", "/");
            (repo, Some(revision))
        }
        None => (target, None),
    }
}

fn remove(args: &CacheRmArgs) -> Result<(), Failure> {
    let (repo, revision) = split_target(&args.target);
    let done = safeload::hub::hub_cache_remove(repo, revision.as_deref(), mode(args.dry_run))?;
    show(&done, args.json)
}

fn prune_cache(args: &CachePruneArgs) -> Result<(), Failure> {
    let done = safeload::hub::hub_cache_prune(args.repo.as_deref(), mode(args.dry_run))?;
    show(&done, args.json)
}

fn show(done: &CacheRemoval, json: bool) -> Result<(), Failure> {
    if json {
        output::json(done)
    } else {
        output::text(&done.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_a_repository_and_maybe_a_revision_escaped_as_in_hf_addresses() {
        assert_eq!(split_target("org/m"), ("org/m", None));
        assert_eq!(
            split_target("org/m@refs%2Fpr%2F1"),
            ("org/m", Some("refs/pr/1".to_owned()))
        );
        assert_eq!(
            split_target("org/m@main"),
            ("org/m", Some("main".to_owned()))
        );
    }
}

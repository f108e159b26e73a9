//! `safeload cache`: what the Hugging Face cache holds for a repository (or every one), or where it is.

use crate::args::CacheArgs;
use crate::failure::Failure;
use crate::output;

/// Runs `safeload cache`.
pub fn run(args: &CacheArgs) -> Result<(), Failure> {
    let listing = safeload::hub_cache(args.repo.as_deref());
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

//! A remote object read whole into memory (a server that ignores `Range`, an index, a file of the repository), never past its listing, its caller's limit or the memory headroom; an allocation refused is an error, not an abort.

use std::collections::TryReserveError;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use futures_util::StreamExt;
use object_store::GetOptions;

use super::super::error::{RemoteError, RemoteErrorKind};
use super::super::hub::HubFileMeta;
use super::{Failure, RemoteObject, classify};

/// The first allocation of a body read whole, where it is longer.
const FIRST_GROWTH: usize = 1 << 20;

enum Body {
    /// Every byte, no more than the object's length.
    Whole(Vec<u8>),
    /// More bytes than the object's length: the rest left unread.
    Longer,
    /// The allocation its next bytes needed was refused, at this many bytes.
    NoMemory(usize),
}

impl RemoteObject {
    /// The whole object, fetched once, for a server that ignores `Range`.
    ///
    /// NOTE: held besides the load's destination (the open refused one past half the
    /// headroom): such servers are rare, and a fetch per read would move it per read.
    pub(super) fn whole(&self) -> Result<Arc<Vec<u8>>, RemoteError> {
        let mut whole = self.whole.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bytes) = &*whole {
            return Ok(Arc::clone(bytes));
        }
        let cap = whole_cap(self.hub.as_ref(), crate::memory::headroom(), u64::MAX);
        let bytes = Arc::new(self.fetch_whole(cap)?);
        *whole = Some(Arc::clone(&bytes));
        Ok(bytes)
    }

    /// The object's bytes for a caller that takes no more than `limit`: refused before a
    /// byte is fetched past that, the listing or the headroom.
    pub(crate) fn read_small(&self, limit: u64) -> Result<Vec<u8>, RemoteError> {
        let len = self.version.len;
        let cap = whole_cap(self.hub.as_ref(), crate::memory::headroom(), limit);
        if len > cap {
            return Err(self.past_cap(len, cap).with_range(0..len));
        }
        if self.prefix.len() as u64 == len {
            return Ok(self.prefix.clone());
        }
        if self.ranges_ignored() {
            return self.fetch_whole(cap);
        }
        let mut bytes = Vec::new();
        let want = usize::try_from(len).unwrap_or(usize::MAX);
        if let Err(e) = bytes.try_reserve_exact(want) {
            return Err(self.no_memory(want, &e).with_range(0..len));
        }
        bytes.resize(want, 0);
        self.read(&mut bytes, want, 0, None)?;
        Ok(bytes)
    }

    /// The whole object by one GET, refused past `cap`, read no further than its length.
    fn fetch_whole(&self, cap: u64) -> Result<Vec<u8>, RemoteError> {
        let len = self.version.len;
        if len > cap {
            return Err(self.past_cap(len, cap).with_range(0..len));
        }
        let most = usize::try_from(len).unwrap_or(usize::MAX);
        let fetched = self.retrying_stalls(0..len, |moved| async move {
            let result = self.get(GetOptions::default()).await?;
            // Grown as bytes arrive, never reserved from the server's length.
            let mut bytes = Vec::new();
            let mut stream = result.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if bytes.len() + chunk.len() > most {
                    return Ok(Body::Longer);
                }
                if grow(&mut bytes, chunk.len(), most).is_err() {
                    return Ok(Body::NoMemory(bytes.len() + chunk.len()));
                }
                moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                bytes.extend_from_slice(&chunk);
            }
            Ok::<_, object_store::Error>(Body::Whole(bytes))
        })?;
        let kind_of = |e: &object_store::Error| match classify(e) {
            Failure::NotFound => RemoteErrorKind::NotFound,
            Failure::Denied => RemoteErrorKind::Denied,
            Failure::Changed => RemoteErrorKind::Changed,
            Failure::RangeIgnored | Failure::Other => RemoteErrorKind::Failed,
        };
        match fetched {
            Ok(Body::Whole(bytes)) if bytes.len() as u64 == len => Ok(bytes),
            Ok(Body::Whole(_) | Body::Longer) => {
                let detail = format!("the whole object is not {len} bytes");
                Err(self
                    .error(RemoteErrorKind::Changed, detail)
                    .with_range(0..len))
            }
            Ok(Body::NoMemory(at)) => {
                let detail = format!(
                    "the memory for {at} of the object's {len} bytes was refused \
                     (RLIMIT_AS, the cgroup's memory limit, or the machine's)"
                );
                Err(self
                    .error(RemoteErrorKind::Failed, detail)
                    .with_range(0..len))
            }
            Err(e) => {
                let text = self.backend.redactor.error_text(&e);
                Err(self.error(kind_of(&e), text).with_range(0..len))
            }
        }
    }

    /// The error of an object of `len` bytes to be held whole, past `cap`.
    pub(super) fn past_cap(&self, len: u64, cap: u64) -> RemoteError {
        let what = if self.ranges_ignored() {
            "the server ignores Range and answers with the whole object"
        } else {
            "the object is read whole"
        };
        let detail =
            format!("{what}, {len} bytes, more than the {cap} bytes it may take in memory");
        self.error(RemoteErrorKind::Protocol, detail)
    }

    fn no_memory(&self, bytes: usize, e: &TryReserveError) -> RemoteError {
        let detail = format!("cannot take {bytes} bytes in memory to read it whole: {e}");
        self.error(RemoteErrorKind::Failed, detail)
    }
}

/// The most bytes of an object read whole: the least of what was listed (`hub`), what its
/// caller takes (`limit`) and the memory headroom. Never sized from a server's word alone.
pub(super) fn whole_cap(hub: Option<&HubFileMeta>, headroom: Option<u64>, limit: u64) -> u64 {
    let listed = hub.and_then(|h| h.size).unwrap_or(u64::MAX);
    listed.min(headroom.unwrap_or(u64::MAX)).min(limit)
}

/// The most bytes the open takes of an object whose server ignores `Range`: half the
/// headroom (the whole object is held besides the destination).
pub(super) fn open_cap(hub: Option<&HubFileMeta>) -> u64 {
    let half = crate::memory::headroom().map(|h| h / 2);
    whole_cap(hub, half, u64::MAX)
}

/// Makes room in `bytes` for `more`: doubling, but never past `most`; an allocation
/// refused is an error here, where `Vec`'s own would abort.
fn grow(bytes: &mut Vec<u8>, more: usize, most: usize) -> Result<(), TryReserveError> {
    let need = bytes.len().saturating_add(more);
    if need <= bytes.capacity() {
        return Ok(());
    }
    let doubled = bytes.capacity().saturating_mul(2).max(FIRST_GROWTH);
    let target = doubled.min(most).max(need);
    bytes.try_reserve_exact(target - bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_least_of_the_listing_the_caller_and_the_memory() {
        let listed = HubFileMeta {
            size: Some(1000),
            ..HubFileMeta::default()
        };
        assert_eq!(whole_cap(Some(&listed), Some(5000), u64::MAX), 1000);
        assert_eq!(whole_cap(Some(&listed), Some(500), u64::MAX), 500);
        assert_eq!(whole_cap(Some(&listed), None, 200), 200);
        // Nothing listed (plain HTTP, a small file without its size): the memory's.
        assert_eq!(whole_cap(None, Some(5000), u64::MAX), 5000);
        assert_eq!(whole_cap(None, None, 7), 7);
        assert_eq!(whole_cap(None, None, u64::MAX), u64::MAX);
    }

    #[test]
    fn growth_doubles_up_to_the_length_and_never_past_it() {
        let most = 3 * FIRST_GROWTH + 5;
        let mut bytes = Vec::new();
        let mut capacities = Vec::new();
        while bytes.len() < most {
            let more = (most - bytes.len()).min(100_000);
            grow(&mut bytes, more, most).unwrap();
            bytes.extend(std::iter::repeat_n(7u8, more));
            if capacities.last() != Some(&bytes.capacity()) {
                capacities.push(bytes.capacity());
            }
        }
        assert_eq!(bytes.len(), most);
        // 1 MiB, 2 MiB, then the length itself: not 4 MiB.
        assert!(capacities.len() <= 3, "{capacities:?}");
        assert!(bytes.capacity() <= most + 64, "{}", bytes.capacity());
    }

    #[test]
    fn an_allocation_refused_is_an_error_not_an_abort() {
        let mut bytes = vec![1u8; 10];
        // More than any allocator gives (past isize::MAX): refused, reported.
        let huge = usize::MAX / 2 + 1;
        assert!(grow(&mut bytes, huge, usize::MAX).is_err());
        assert_eq!(bytes, [1u8; 10], "untouched");
    }
}

//! A remote object's positional reads: the bytes the open kept copied, the rest fetched by ranged GETs under `If-Match` (or taken from the whole object, for a server that ignores `Range`), each handed on in order as it arrives.

use std::ops::Range;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use object_store::{GetOptions, GetRange};

use super::super::error::{RemoteError, RemoteErrorKind};
use super::super::landing::{Filling, Landing};
use super::super::watch::Interrupt;
use super::{Failure, RemoteObject, classify};

impl RemoteObject {
    /// Fills `dst` from `offset` (up to the object's end), at least `required` bytes, from
    /// the version opened; the open's kept bytes are copied, never fetched again. `landing`
    /// is handed the bytes in order as they arrive, each once.
    pub(crate) fn read(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
        landing: Option<&Landing<'_>>,
    ) -> Result<(), RemoteError> {
        let len = self.version.len;
        let want = len.saturating_sub(offset).min(dst.len() as u64) as usize;
        if want < required {
            let detail = format!("the object has {len} bytes, {required} were required");
            let end = offset.saturating_add(required as u64);
            return Err(self
                .error(RemoteErrorKind::Protocol, detail)
                .with_range(offset..end));
        }
        let Some(dst) = dst.get_mut(..want).filter(|d| !d.is_empty()) else {
            return Ok(());
        };
        let kept = copy_from(&self.prefix, dst, offset);
        let (head, rest) = dst.split_at_mut(kept);
        if let (Some(land), false) = (landing, head.is_empty()) {
            land(offset, head);
        }
        if rest.is_empty() {
            return Ok(());
        }
        let range = offset + kept as u64..offset + want as u64;
        if !self.ranges_ignored() {
            match self.read_ranges(rest, range.clone(), landing) {
                Some(result) => return result,
                None => self.ranges_ignored.store(true, Ordering::Relaxed),
            }
        }
        let whole = self.whole()?;
        if copy_from(&whole, rest, range.start) == rest.len() {
            if let Some(land) = landing {
                land(range.start, rest);
            }
            return Ok(());
        }
        // `whole()` checked its length against the object's: out of reach.
        let detail = "the whole object is shorter than its length".to_owned();
        Err(self
            .error(RemoteErrorKind::Protocol, detail)
            .with_range(range))
    }

    /// Ranged GETs until `dst` (the bytes of `range`) is full; `None` where the server
    /// turned out to ignore ranges before sending any byte.
    fn read_ranges(
        &self,
        dst: &mut [u8],
        range: Range<u64>,
        landing: Option<&Landing<'_>>,
    ) -> Option<Result<(), RemoteError>> {
        let mut filling = Filling::new(dst, range.start, landing);
        let pace = self.backend.tuning.pace;
        let mut stalls = 0;
        // Each pass is one request (object_store retries inside it); a pass repeats only
        // after a clean short body or a stall.
        for _ in 0..=self.backend.tuning.max_retries + pace.retries {
            let from = range.start + filling.got as u64;
            let options = GetOptions {
                range: Some(GetRange::Bounded(from..range.end)),
                ..GetOptions::default()
            };
            let into = &mut filling;
            let pass = self.backend.runtime.request(pace, |moved| async move {
                let result = self.get(options).await?;
                let mut stream = result.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    // The future runs on the reading thread (`block_on`).
                    if !into.put(&chunk) {
                        return Ok(false);
                    }
                    moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Ok::<_, object_store::Error>(true)
            });
            let failed =
                |kind, detail| Some(Err(self.error(kind, detail).with_range(range.clone())));
            let pass = match pass {
                Ok(pass) => pass,
                Err(Interrupt::Stalled { .. }) if stalls < pace.retries => {
                    stalls += 1;
                    continue;
                }
                Err(why) => {
                    // The error's range starts at the byte reached.
                    let reached = range.start + filling.got as u64..range.end;
                    let why = match why {
                        Interrupt::Stalled { .. } => Interrupt::Stalled { moved: 0 },
                        cancelled => cancelled,
                    };
                    return Some(Err(self.interrupted(why, reached)));
                }
            };
            match pass {
                Ok(true) if filling.is_full() => {
                    filling.land();
                    return Some(Ok(()));
                }
                Ok(true) => continue,
                Ok(false) => {
                    let detail = "the server sent more than the range asked".into();
                    return failed(RemoteErrorKind::Protocol, detail);
                }
                Err(e) => return self.failed_get(&e, range, filling.got),
            }
        }
        let (got, len) = (filling.got, filling.len());
        let tries = self.backend.tuning.max_retries + 1;
        let detail = format!("short bodies: {got} of {len} bytes after {tries} requests");
        Some(Err(self
            .error(RemoteErrorKind::Failed, detail)
            .with_range(range)))
    }

    /// A ranged GET's failure as an error of `range`; `None` where ranges are ignored
    /// and nothing came yet (`got`).
    fn failed_get(
        &self,
        e: &object_store::Error,
        range: Range<u64>,
        got: usize,
    ) -> Option<Result<(), RemoteError>> {
        let text = self.backend.redactor.error_text(e);
        let kind = match classify(e) {
            Failure::RangeIgnored if got == 0 => return None,
            Failure::RangeIgnored | Failure::Changed => RemoteErrorKind::Changed,
            Failure::NotFound => RemoteErrorKind::NotFound,
            Failure::Denied => RemoteErrorKind::Denied,
            Failure::Other => RemoteErrorKind::Failed,
        };
        Some(Err(self.error(kind, text).with_range(range)))
    }
}

/// Copies into `dst` what `bytes` (an object's first bytes) hold from `offset`: the count.
fn copy_from(bytes: &[u8], dst: &mut [u8], offset: u64) -> usize {
    let Some(src) = usize::try_from(offset).ok().and_then(|at| bytes.get(at..)) else {
        return 0;
    };
    let n = src.len().min(dst.len());
    match (dst.get_mut(..n), src.get(..n)) {
        (Some(dst), Some(src)) => {
            dst.copy_from_slice(src);
            n
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::copy_from;

    #[test]
    fn a_copy_takes_what_the_bytes_hold_of_the_range() {
        let bytes: Vec<u8> = (0..100).collect();
        let mut dst = [0u8; 30];
        // Inside, across the end, past it.
        assert_eq!(copy_from(&bytes, &mut dst, 10), 30);
        assert_eq!(dst[0], 10);
        assert_eq!(copy_from(&bytes, &mut dst, 90), 10);
        assert_eq!(&dst[..10], &bytes[90..]);
        assert_eq!(copy_from(&bytes, &mut dst, 100), 0);
        assert_eq!(copy_from(&bytes, &mut dst, u64::MAX), 0);
    }
}

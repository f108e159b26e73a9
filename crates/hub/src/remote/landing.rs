//! A ranged body filling the caller's buffer, handed on as it arrives to whoever writes it elsewhere too (a cache), so that a read killed half way has left what it fetched.

/// Where a read hands the bytes it fetched, in order: the offset of the first and the bytes.
pub(crate) type Landing<'a> = dyn Fn(u64, &[u8]) + Sync + 'a;

/// Bytes of a long body that arrive between two handings to a read's [`Landing`].
///
/// NOTE: a quarter of a resumed file's piece (BENCHMARKS.md, "cache/partial.rs: PIECE").
pub(crate) const LAND_STEP: usize = 256 << 10;

/// A buffer being filled from `start` of an object, over one or more requests.
pub(crate) struct Filling<'a> {
    dst: &'a mut [u8],
    start: u64,
    /// Bytes in `dst` so far, and of those handed to `landing`.
    pub got: usize,
    landed: usize,
    landing: Option<&'a Landing<'a>>,
}

impl<'a> Filling<'a> {
    pub(crate) fn new(dst: &'a mut [u8], start: u64, landing: Option<&'a Landing<'a>>) -> Self {
        Filling {
            dst,
            start,
            got: 0,
            landed: 0,
            landing,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.dst.len()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.got == self.dst.len()
    }

    /// The next chunk of the body: `false` where it passes the buffer's end.
    pub(crate) fn put(&mut self, chunk: &[u8]) -> bool {
        let Some(slot) = self.dst.get_mut(self.got..self.got + chunk.len()) else {
            return false;
        };
        slot.copy_from_slice(chunk);
        self.got += chunk.len();
        if self.got - self.landed >= LAND_STEP {
            self.land();
        }
        true
    }

    /// Hands what arrived since the last handing on.
    pub(crate) fn land(&mut self) {
        if let (Some(land), Some(arrived)) = (self.landing, self.dst.get(self.landed..self.got)) {
            if !arrived.is_empty() {
                land(self.start + self.landed as u64, arrived);
            }
        }
        self.landed = self.got;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn chunks_are_handed_on_in_order_each_once() {
        let seen = Mutex::new(Vec::new());
        let land = |at: u64, bytes: &[u8]| seen.lock().unwrap().push((at, bytes.to_vec()));
        let mut dst = vec![0u8; LAND_STEP * 4 + 10];
        let body: Vec<u8> = (0..dst.len()).map(|i| (i % 251) as u8).collect();
        let mut filling = Filling::new(&mut dst, 1000, Some(&land));
        for chunk in body.chunks(100_000) {
            assert!(filling.put(chunk));
        }
        assert!(filling.is_full());
        assert!(!filling.put(&[1]), "past the end");
        filling.land();
        let seen = seen.into_inner().unwrap();
        assert!(seen.len() >= 3);
        let mut at = 1000;
        let mut all = Vec::new();
        for (offset, bytes) in seen {
            assert_eq!(offset, at);
            at += bytes.len() as u64;
            all.extend(bytes);
        }
        assert!(all == body && dst == body);
    }
}

//! The report of a load to a device, as data: per file how its bytes reached the device (`Route`), in how many chunks, how fast; and its words.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How a file's bytes reached the staging buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Route {
    /// Copied from the file's map by the crate's readers, the map's pages
    /// let go of as they were copied.
    Mapped,
    /// Read with positional reads straight into the staging buffers,
    /// through the page cache (or from a remote object, a cache's file).
    Read,
    /// Read the same way with `O_DIRECT`, past the page cache.
    Direct,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Route::Mapped => "copied from its map into the staging buffers",
            Route::Read => "read into the staging buffers",
            Route::Direct => "read into the staging buffers with O_DIRECT",
        })
    }
}

/// One file of a load to a device.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DeviceFileReport {
    /// The file, as opened.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::path_text")
    )]
    pub path: PathBuf,
    /// How its bytes reached the staging buffers.
    pub route: Route,
    /// Tensors placed on the device (whole or in part).
    pub tensors: usize,
    /// Those converted to the load's dtype in the staging buffers.
    pub converted: usize,
    /// Values the conversions took beyond the target's range (infinite on
    /// the device), as [`FileReport::overflowed`](safeload_core::report::FileReport::overflowed).
    pub overflowed: u64,
    /// Bytes placed on the device.
    pub bytes: u64,
    /// Bytes read from the file (or copied from its map), the gaps of
    /// merged reads included.
    pub bytes_read: u64,
    /// Copies to the device (one per chunk of up to a staging buffer).
    pub chunks: usize,
    /// From the start of its first read to the end of its last copy.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::seconds")
    )]
    pub elapsed: Duration,
}

impl DeviceFileReport {
    /// Bytes placed on the device per second of [`elapsed`](Self::elapsed)
    /// (0 for a file with nothing to place).
    pub fn bytes_per_second(&self) -> f64 {
        rate(self.bytes, self.elapsed)
    }
}

/// A load to a device: the device, the staging ring, and each file.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DeviceReport {
    /// The device, in its own words.
    pub device: String,
    /// The staging ring: its buffers, and the bytes of each.
    pub staging_buffers: usize,
    /// See [`staging_buffers`](Self::staging_buffers).
    pub staging_bytes: usize,
    /// Reader threads that ran.
    pub readers: usize,
    /// Files with something placed on the device, in load order.
    pub files: Vec<DeviceFileReport>,
    /// The whole load, slabs allocated to the last copy completed.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::seconds")
    )]
    pub elapsed: Duration,
}

impl DeviceReport {
    /// Bytes placed on the device.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Copies made.
    pub fn chunks(&self) -> usize {
        self.files.iter().map(|f| f.chunks).sum()
    }

    /// Bytes placed per second of the whole load.
    pub fn bytes_per_second(&self) -> f64 {
        rate(self.bytes(), self.elapsed)
    }
}

fn rate(bytes: u64, elapsed: Duration) -> f64 {
    match elapsed.as_secs_f64() {
        s if s > 0.0 => bytes as f64 / s,
        _ => 0.0,
    }
}

impl fmt::Display for DeviceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = (1 << 20) as f64;
        writeln!(
            f,
            "{:.1} MiB to {} in {:.3} s ({:.0} MiB/s), {} chunks through {} staging buffers of {} MiB, {} readers",
            self.bytes() as f64 / MIB,
            self.device,
            self.elapsed.as_secs_f64(),
            self.bytes_per_second() / MIB,
            self.chunks(),
            self.staging_buffers,
            self.staging_bytes >> 20,
            self.readers,
        )?;
        for file in &self.files {
            writeln!(
                f,
                "  {}: {} tensors ({} converted), {:.1} MiB {} in {} chunks, {:.3} s ({:.0} MiB/s)",
                file.path.display(),
                file.tensors,
                file.converted,
                file.bytes as f64 / MIB,
                file.route,
                file.chunks,
                file.elapsed.as_secs_f64(),
                file.bytes_per_second() / MIB,
            )?;
        }
        Ok(())
    }
}

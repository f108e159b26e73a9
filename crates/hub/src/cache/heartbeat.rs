//! The partial files this process writes under their lock, marked as changed every second: a waiter sees a live, running writer from its first step (a stopped process holds its locks but beats no more).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use super::temp::TempFile;

/// How often the files held are marked.
const BEAT: Duration = Duration::from_secs(1);

/// The files held, and whether the thread that marks them runs.
static HELD: Mutex<(Vec<Weak<TempFile>>, bool)> = Mutex::new((Vec::new(), false));

/// Marks `file`'s file as changed every [`BEAT`] while it is alive, on one thread of the
/// process's; a thread that cannot be had costs the waiters their patience only.
pub(crate) fn hold(file: &Arc<TempFile>) {
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    held.0.push(Arc::downgrade(file));
    if held.1 {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("safeload-heartbeat".into())
        .stack_size(64 << 10)
        .spawn(beat);
    held.1 = spawned.is_ok();
}

/// Marks the files held until none is left.
fn beat() {
    loop {
        std::thread::sleep(BEAT);
        let alive: Vec<Arc<TempFile>> = {
            let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
            held.0.retain(|f| f.strong_count() > 0);
            if held.0.is_empty() {
                held.1 = false;
                return;
            }
            held.0.iter().filter_map(Weak::upgrade).collect()
        };
        let now = SystemTime::now();
        for temp in alive {
            let _ = temp.file.set_modified(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_file_is_marked_until_it_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let folder = crate::os::Dir::open(dir.path()).unwrap();
        let temp = Arc::new(TempFile::make(folder, "final", 10, None).unwrap());
        // A second name of the file, to look at it once the temporary one is gone.
        let seen = dir.path().join("seen");
        std::fs::hard_link(dir.path().join(&temp.temp), &seen).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        temp.file.set_modified(old).unwrap();
        hold(&temp);
        std::thread::sleep(BEAT * 2 + Duration::from_millis(300));
        let marked = std::fs::metadata(&seen).unwrap().modified().unwrap();
        assert!(marked > old + Duration::from_secs(3000), "{marked:?}");
        drop(temp);
        let file = std::fs::File::options().write(true).open(&seen).unwrap();
        file.set_modified(old).unwrap();
        std::thread::sleep(BEAT * 2 + Duration::from_millis(300));
        assert_eq!(std::fs::metadata(&seen).unwrap().modified().unwrap(), old);
    }
}

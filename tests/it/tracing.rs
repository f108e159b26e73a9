//! The `tracing` feature: a load emits an event per file with its strategy
//! and why, and one with the totals. `cargo test --features tracing --test it tracing::`.
//!
//! Run in a child process of its own (`common::child`): the callsite registry
//! is the process's. With one subscriber registered, tracing-core 0.1.36 asks
//! only the default subscriber of the thread that reaches a callsite first
//! (`Rebuilder::JustOne` in callsite.rs), and caches its answer for every
//! thread: a callsite another test's load reached first, while this test's
//! `with_default` subscriber was set, stayed off for it. Beside the candle
//! tests the per-file events were lost in 2 runs of 2 (2026-12-01); alone,
//! never.

use std::sync::{Arc, Mutex};

use crate::common::child::{run_alone, run_role};
use crate::common::*;
use tempfile::tempdir;
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber, span};

/// A subscriber that keeps every event's target, level and fields as text.
#[derive(Default, Clone)]
struct Recorder {
    events: Arc<Mutex<Vec<String>>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(format!(
            "{} {}",
            event.metadata().target(),
            event.metadata().level()
        ));
        event.record(&mut fields);
        self.events.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[("events", events_in_child)]);
}

#[test]
fn a_load_says_what_it_chose_and_what_it_did() {
    run_alone(module_path!(), "events");
}

fn events_in_child() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 2);
    let recorder = Recorder::default();
    tracing::subscriber::with_default(recorder.clone(), || {
        safeload::Loader::new()
            .disable_mmap(true)
            .load(&index)
            .unwrap();
    });
    let events = recorder.events.lock().unwrap();
    let opened: Vec<&String> = events
        .iter()
        .filter(|e| e.contains("message=opened"))
        .collect();
    assert_eq!(opened.len(), 2, "{events:#?}");
    assert!(
        opened
            .iter()
            .all(|e| e.starts_with("safeload DEBUG") && e.contains("strategy=buffered"))
    );
    assert!(
        opened
            .iter()
            .all(|e| e.contains("disable_mmap(true) was requested")),
        "{opened:?}"
    );
    let loaded: Vec<&String> = events
        .iter()
        .filter(|e| e.contains("message=loaded"))
        .collect();
    assert_eq!(loaded.len(), 1, "{events:#?}");
    assert!(
        loaded[0].starts_with("safeload INFO") && loaded[0].contains("files=2"),
        "{loaded:?}"
    );
    assert!(
        !events.iter().any(|e| e.contains(" WARN")),
        "nothing to act on: {events:#?}"
    );
}

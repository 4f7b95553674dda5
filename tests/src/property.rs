//! [`check_property`]: a proptest property checked against one [`Harness`], for the
//! suites that throw many generated requests at keypool (usually through
//! [`Harness::handle`], in process, so that a case costs no connection).
//!
//! One harness serves every case (starting one per case would cost more than the
//! cases); a failing case is shrunk and its seed persisted beside the suite
//! (`tests/tests/<suite>.proptest-regressions`), as `proptest!` does.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestRunner};

use crate::harness::{Harness, HarnessBuilder};

/// Starts `builder`'s harness on a current-thread runtime, then runs `check` on `cases`
/// inputs drawn from `strategy`, and finally [`Harness::finish`]es it (so the "no LB key
/// upstream" check covers every case). `source_file` is the suite's `file!()`: where
/// failing seeds are persisted and replayed first.
///
/// # Panics
/// With proptest's report of the smallest failing input, when `check` panics for one.
pub fn check_property<S>(
    builder: HarnessBuilder,
    cases: u32,
    source_file: &'static str,
    strategy: S,
    check: impl AsyncFn(&Harness, S::Value),
) where
    S: Strategy,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let harness = runtime.block_on(builder.start());
    let config = Config {
        cases,
        source_file: Some(source_file),
        ..Config::default()
    };
    let result = TestRunner::new(config).run(&strategy, |input| {
        runtime.block_on(check(&harness, input));
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    runtime.block_on(harness.finish());
}

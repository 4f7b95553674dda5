//! Log lines captured in memory, for suites that assert on what keypool logged.
//!
//! ```no_run
//! use keypool_tests::LogLines;
//! let lines = LogLines::default();
//! let writer = lines.clone();
//! let subscriber = tracing_subscriber::fmt()
//!     .with_ansi(false)
//!     .with_writer(move || writer.clone())
//!     .finish();
//! let _guard = tracing::subscriber::set_default(subscriber);
//! // ... run keypool on this thread ...
//! assert!(!lines.text().contains("sk-lb-"));
//! ```

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

/// Every byte written to any clone, in order: a `tracing_subscriber` writer.
#[derive(Debug, Clone, Default)]
pub struct LogLines(Arc<Mutex<Vec<u8>>>);

impl LogLines {
    /// Everything written so far (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

//! Locking that survives a panicked holder: the simulator's state stays usable (a test that
//! panicked while holding a lock must not poison every later request).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

//! What "now" is to the installation-token cache: the system clock, plus an offset that a
//! test moves ahead ([`Clock::advance`]) instead of sleeping until a token nears its expiry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The token cache's clock; cheap to clone, clones share the offset. `Clock::default()`
/// is the system clock.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    ahead_ms: Arc<AtomicU64>,
}

impl Clock {
    pub fn now(&self) -> SystemTime {
        SystemTime::now() + Duration::from_millis(self.ahead_ms.load(Ordering::SeqCst))
    }

    /// Moves this clock (and every clone of it) `by` ahead of the system clock.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.ahead_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

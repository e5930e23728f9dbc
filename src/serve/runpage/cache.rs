//! The rendered pages, kept for the next viewer of the same page: keyed by everything the
//! page shows (the run's row, where the page starts, the transcript's last record), so an
//! entry is never stale, only unused; the least recently used go once the entries pass
//! their byte budget. Viewers of a cached page share its bytes: a thousand views of one
//! page hold it once.

use std::collections::HashMap;

use bytes::Bytes;
use parking_lot::Mutex;

/// Bytes of pages kept at most.
pub const CACHE_BYTES: usize = 32 << 20;

pub(super) struct PageCache {
    inner: Mutex<Inner>,
    budget: usize,
}

#[derive(Default)]
struct Inner {
    /// Page → (its HTML, when it was last used).
    pages: HashMap<String, (Bytes, u64)>,
    bytes: usize,
    clock: u64,
}

impl PageCache {
    pub fn new(budget: usize) -> PageCache {
        PageCache {
            inner: Mutex::default(),
            budget,
        }
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let (page, used) = inner.pages.get_mut(key)?;
        *used = clock;
        Some(page.clone())
    }

    /// Keeps `page` (unless it alone takes more than a quarter of the budget), dropping the
    /// least recently used pages while over the budget.
    pub fn put(&self, key: String, page: Bytes) {
        if page.len() > self.budget / 4 {
            return;
        }
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let clock = inner.clock;
        inner.bytes += page.len();
        if let Some((old, _)) = inner.pages.insert(key, (page, clock)) {
            inner.bytes -= old.len();
        }
        while inner.bytes > self.budget {
            let Some(oldest) = inner
                .pages
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((gone, _)) = inner.pages.remove(&oldest) {
                inner.bytes -= gone.len();
            }
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_pages_go_past_the_budget() {
        let cache = PageCache::new(400);
        let page = |c: u8| Bytes::from(vec![c; 100]);
        for k in ["a", "b", "c", "d"] {
            cache.put(k.into(), page(k.as_bytes()[0]));
        }
        assert_eq!(cache.bytes(), 400);
        assert!(cache.get("a").is_some(), "a is used again");
        cache.put("e".into(), page(b'e'));
        assert!(cache.get("b").is_none(), "b was the least recently used");
        assert!(cache.get("a").is_some() && cache.get("e").is_some());
        assert_eq!(cache.bytes(), 400);
        // The same page again replaces it; one too big for the cache is not kept.
        cache.put("e".into(), page(b'f'));
        assert_eq!(cache.get("e").unwrap()[0], b'f');
        assert_eq!(cache.bytes(), 400);
        cache.put("huge".into(), Bytes::from(vec![0; 101]));
        assert!(cache.get("huge").is_none());
    }
}

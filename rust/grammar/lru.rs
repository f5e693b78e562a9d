//! A small least-recently-used map (a few dozen compiled grammars: a linear scan is fine).

pub struct Lru<K, V> {
    cap: usize,
    /// Most recently used last.
    items: Vec<(K, V)>,
    pub hits: u64,
    pub misses: u64,
}

impl<K: PartialEq, V: Clone> Lru<K, V> {
    pub fn new(cap: usize) -> Self {
        Lru {
            cap,
            items: Vec::new(),
            hits: 0,
            misses: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The value for `k` (now the most recent), counting a hit or a miss.
    pub fn get(&mut self, k: &K) -> Option<V> {
        match self.items.iter().position(|(key, _)| key == k) {
            Some(i) => {
                let item = self.items.remove(i);
                let v = item.1.clone();
                self.items.push(item);
                self.hits += 1;
                Some(v)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Keeps `v` for `k` as the most recent, dropping the least recent beyond the capacity.
    pub fn put(&mut self, k: K, v: V) {
        self.items.retain(|(key, _)| key != &k);
        self.items.push((k, v));
        while self.items.len() > self.cap {
            self.items.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn least_recently_used_goes_first() {
        let mut c = Lru::new(2);
        c.put("a", 1);
        c.put("b", 2);
        assert_eq!(c.get(&"a"), Some(1)); // a is now the most recent
        c.put("c", 3);
        assert_eq!(
            (c.get(&"b"), c.get(&"a"), c.get(&"c")),
            (None, Some(1), Some(3))
        );
        c.put("a", 4);
        assert_eq!((c.len(), c.get(&"a")), (2, Some(4)));
        assert_eq!((c.hits, c.misses), (4, 1));
    }
}

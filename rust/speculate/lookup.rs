//! Prompt lookup (n-gram) drafting: the last `n` tokens of the sequence are looked up in the
//! sequence itself (the prompt and the answer so far), most recent occurrence first; the
//! tokens that followed it are the draft. Free to make, and right where an answer copies its
//! input: code edits, summaries and quotes, retrieved passages, tool-call arguments.

/// A prompt-lookup drafter: n-grams of `max_n` down to `min_n` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for PromptLookup {
    /// Trigrams down to bigrams: a single repeated token is too weak a signal (it drafts on
    /// every common word), four tokens rarely match in ordinary text.
    fn default() -> Self {
        PromptLookup { min_n: 2, max_n: 3 }
    }
}

impl PromptLookup {
    /// Up to `k` tokens that followed the most recent earlier occurrence of the sequence's
    /// last `n` tokens (longest `n` first), or nothing when no n-gram recurs. `seq` is the
    /// whole sequence: prompt, answer so far and the token about to be fed.
    pub fn propose(&self, seq: &[u32], k: usize) -> Vec<u32> {
        if k == 0 {
            return Vec::new();
        }
        let len = seq.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let tail = &seq[len - n..];
            // occurrences starting at i < len - n, most recent first; the continuation
            // starts right after one and may run into the tail itself (a repetition)
            for i in (0..len - n).rev() {
                if seq[i] == tail[0] && &seq[i..i + n] == tail {
                    let start = i + n;
                    let end = (start + k).min(len);
                    return seq[start..end].to_vec();
                }
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_what_followed_the_latest_occurrence() {
        let p = PromptLookup::default();
        // "1 2 3 4 5 ... 1 2 3" -> 4 5 6
        let seq = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(p.propose(&seq, 3), vec![4, 5, 6]);
        assert_eq!(p.propose(&seq, 1), vec![4]);
        assert_eq!(p.propose(&seq, 0), Vec::<u32>::new());
        // the most recent occurrence wins
        let seq = [7, 8, 1, 7, 8, 2, 0, 7, 8];
        assert_eq!(p.propose(&seq, 2), vec![2, 0]);
    }

    #[test]
    fn longer_ngrams_first_then_shorter() {
        let p = PromptLookup::default();
        // the trigram "5 7 8" occurs once (-> 3); the bigram "7 8" later (-> 4): trigram wins
        let seq = [5, 7, 8, 3, 0, 7, 8, 4, 0, 5, 7, 8];
        assert_eq!(p.propose(&seq, 1), vec![3]);
        // only the bigram recurs
        let seq = [6, 7, 8, 4, 0, 1, 7, 8];
        assert_eq!(p.propose(&seq, 2), vec![4, 0]);
    }

    #[test]
    fn nothing_when_nothing_recurs_or_the_sequence_is_short() {
        let p = PromptLookup::default();
        assert!(p.propose(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(p.propose(&[1], 4).is_empty());
        assert!(p.propose(&[], 4).is_empty());
        // a single repeated token is below min_n
        assert!(p.propose(&[9, 1, 2, 9], 2).is_empty());
    }

    #[test]
    fn a_repetition_drafts_into_itself_and_stops_at_the_end() {
        let p = PromptLookup::default();
        let seq = [4, 5, 4, 5, 4, 5];
        // "4 5" last seen at 2 -> continuation 4 5 (positions 4, 5), then the end
        assert_eq!(p.propose(&seq, 8), vec![4, 5]);
    }
}

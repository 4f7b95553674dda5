//! The attempt ceiling of SPEC 3.7 as a pure state machine: one attempt per account of
//! the plan, and once an attempt failed with a request error (400, 404, 413, 422) at
//! most one more account; a second request error is terminal.

/// Counts the attempts of one request and says whether another may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttemptCeiling {
    started: usize,
    limit: usize,
    request_errors: usize,
}

impl AttemptCeiling {
    /// A ceiling of `plan_len` attempts (the snapshot's survivors).
    pub(crate) fn new(plan_len: usize) -> Self {
        Self {
            started: 0,
            limit: plan_len,
            request_errors: 0,
        }
    }

    /// Whether one more attempt may start now.
    pub(crate) fn may_start(&self) -> bool {
        self.started < self.limit
    }

    /// Records that an attempt started.
    pub(crate) fn start(&mut self) {
        self.started += 1;
    }

    /// How many attempts started.
    pub(crate) fn started(&self) -> usize {
        self.started
    }

    /// Records a failed attempt; `in_flight` is how many other attempts are still
    /// running (a hedge/race partner). After the first request error, the "one more
    /// account" is the partner in flight if there is one, else the next of the plan.
    pub(crate) fn failed(&mut self, request_error: bool, in_flight: usize) {
        if !request_error {
            return;
        }
        self.request_errors += 1;
        self.limit = if self.request_errors >= 2 {
            0
        } else {
            self.limit.min(self.started + usize::from(in_flight == 0))
        };
    }

    /// Whether the request must stop now (a second request error): attempts still in
    /// flight are abandoned.
    pub(crate) fn terminal(&self) -> bool {
        self.limit == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Walks a plan sequentially with the given outcomes (`true` = request error);
    /// returns how many attempts started.
    fn walk(plan_len: usize, outcomes: &[bool]) -> usize {
        let mut c = AttemptCeiling::new(plan_len);
        let mut outcomes = outcomes.iter();
        while c.may_start() {
            c.start();
            match outcomes.next() {
                Some(&request_error) => c.failed(request_error, 0),
                None => break,
            }
        }
        c.started()
    }

    #[test]
    fn spec_examples() {
        // 400, 400 → stop after two, whatever the pool size.
        assert_eq!(walk(10, &[true, true, false]), 2);
        // 400, then a 529: the one more account was tried, stop.
        assert_eq!(walk(10, &[true, false, false]), 2);
        // 529, 529, 400, 429 → four attempts.
        assert_eq!(walk(10, &[false, false, true, false, false]), 4);
        // Ordinary failures walk the whole plan, never further.
        assert_eq!(walk(3, &[false; 10]), 3);
        // A request error with a partner in flight: that partner is the one more.
        let mut c = AttemptCeiling::new(5);
        c.start();
        c.start();
        c.failed(true, 1);
        assert!(!c.may_start());
        assert!(!c.terminal());
        c.failed(true, 0);
        assert!(c.terminal());
    }

    proptest! {
        #[test]
        fn never_exceeds_the_plan_nor_the_request_error_rule(
            plan_len in 0usize..12,
            outcomes in proptest::collection::vec(any::<bool>(), 0..16),
        ) {
            let started = walk(plan_len, &outcomes);
            prop_assert!(started <= plan_len);
            if let Some(first) = outcomes.iter().position(|&re| re) {
                // At most one more attempt after the first request error.
                prop_assert!(started <= first + 2);
            } else if outcomes.len() >= plan_len {
                // Without request errors and enough failures, the whole plan is tried.
                prop_assert_eq!(started, plan_len);
            }
        }
    }
}

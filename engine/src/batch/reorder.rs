//! The reorder buffer: items finish in any order, their lines are written in input order. Each
//! line read takes the next place; a place is filled when its item is settled, and the places
//! at the front are written as they fill, up to the first item that stopped unfinished, after
//! which nothing more is written (that item resumes on the next start).

use std::collections::VecDeque;

use super::error::BatchError;

/// What one line becomes.
pub(super) enum Slot {
    Waiting,
    Line(String),
    /// Stopped before finishing (Ctrl-C): nothing written from here on.
    Unfinished,
}

/// Lines in input order, written from the front as they fill.
pub(super) struct Reorder {
    slots: VecDeque<Slot>,
    /// The sequence number of `slots[0]`.
    first: u64,
    /// The sequence number the next line takes: how many lines were placed.
    next: u64,
    /// Most places held at once.
    window: usize,
    /// An unfinished place reached the front: nothing more is written.
    blocked: bool,
}

impl Reorder {
    pub(super) fn new(window: usize) -> Reorder {
        Reorder {
            slots: VecDeque::new(),
            first: 0,
            next: 0,
            window,
            blocked: false,
        }
    }

    /// Whether a line may take a place: fewer than the window are held.
    pub(super) fn has_room(&self) -> bool {
        self.slots.len() < self.window
    }

    /// Takes the next place, waiting to be filled; returns its sequence number.
    pub(super) fn push(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.slots.push_back(Slot::Waiting);
        seq
    }

    /// Fills the place `seq` took.
    pub(super) fn set(&mut self, seq: u64, slot: Slot) {
        self.slots[(seq - self.first) as usize] = slot;
    }

    /// How many lines took a place.
    pub(super) fn placed(&self) -> u64 {
        self.next
    }

    /// Whether an unfinished place reached the front.
    pub(super) fn blocked(&self) -> bool {
        self.blocked
    }

    /// Writes the lines at the front that are ready, in order, until a place that waits; an
    /// unfinished place stops the writing for good.
    pub(super) fn write_ready(
        &mut self,
        mut write: impl FnMut(&str) -> Result<(), BatchError>,
    ) -> Result<(), BatchError> {
        while !self.blocked {
            match self.slots.front() {
                Some(Slot::Line(_)) => {
                    let Some(Slot::Line(text)) = self.slots.pop_front() else {
                        unreachable!()
                    };
                    self.first += 1;
                    write(&text)?;
                }
                Some(Slot::Unfinished) => self.blocked = true,
                _ => break,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines filled out of order are written in order, each once, and nothing after an
    /// unfinished one.
    #[test]
    fn lines_are_written_in_input_order_up_to_an_unfinished_one() {
        let mut r = Reorder::new(8);
        let mut written = Vec::new();
        let seqs: Vec<u64> = (0..5).map(|_| r.push()).collect();
        assert_eq!(seqs, [0, 1, 2, 3, 4]);
        r.set(1, Slot::Line("b".into()));
        r.write_ready(|t| {
            written.push(t.to_string());
            Ok(())
        })
        .unwrap();
        assert!(written.is_empty(), "the first line waits");
        r.set(0, Slot::Line("a".into()));
        r.set(3, Slot::Unfinished);
        r.set(4, Slot::Line("e".into()));
        r.write_ready(|t| {
            written.push(t.to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(written, ["a", "b"]);
        r.set(2, Slot::Line("c".into()));
        r.write_ready(|t| {
            written.push(t.to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(written, ["a", "b", "c"]);
        assert!(r.blocked());
        // Places after the written ones are still counted against the window.
        assert_eq!((r.placed(), r.slots.len()), (5, 2));
        let _ = r.push();
        assert_eq!(r.slots.len(), 3);
        assert!(r.has_room());
    }

    #[test]
    fn the_window_bounds_the_places_held() {
        let mut r = Reorder::new(2);
        r.push();
        assert!(r.has_room());
        r.push();
        assert!(!r.has_room());
        r.set(0, Slot::Line("a".into()));
        r.write_ready(|_| Ok(())).unwrap();
        assert!(r.has_room());
    }
}

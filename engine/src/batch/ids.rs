//! The ids pass: every line's id read before anything runs (the rest of each line only
//! checked, not built), so that duplicate ids are refused, naming their lines, before the
//! first item starts, and the number of items is known.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};

use super::error::BatchError;
use super::input::Lines;
use super::options::BatchOptions;

fn id_hash(id: &str) -> u128 {
    // Two independent 64-bit hashes: a false duplicate needs both to collide.
    let mut h1 = FIXED[0].build_hasher();
    h1.write(id.as_bytes());
    let mut h2 = FIXED[1].build_hasher();
    h2.write(id.as_bytes());
    (u128::from(h1.finish()) << 64) | u128::from(h2.finish())
}

static FIXED: std::sync::LazyLock<[std::hash::RandomState; 2]> =
    std::sync::LazyLock::new(|| [std::hash::RandomState::new(), std::hash::RandomState::new()]);

/// Reads the ids of every line; refuses duplicates, naming their lines. Returns the count.
pub(crate) fn scan(options: &BatchOptions) -> Result<u64, BatchError> {
    let mut lines = Lines::open(&options.input, &options.id_field)?;
    let mut seen: HashSet<u128> = HashSet::new();
    let mut dups: HashSet<String> = HashSet::new();
    let mut count = 0u64;
    let mut any_has = false;
    while let Some((_, id, has)) = lines.next_id()? {
        count += 1;
        let Some(has) = has else {
            // A line that is not JSON is named by its position: it can repeat no id.
            continue;
        };
        any_has |= has;
        if !seen.insert(id_hash(&id)) {
            dups.insert(id);
        }
    }
    if options.id_field_given && count > 0 && !any_has {
        return Err(BatchError::NoIdField {
            path: options.input.display().to_string(),
            field: options.id_field.clone(),
        });
    }
    if dups.is_empty() {
        return Ok(count);
    }
    // Second look, only for the duplicated ids: where they are.
    let mut at: Vec<(String, Vec<u64>)> = Vec::new();
    let mut lines = Lines::open(&options.input, &options.id_field)?;
    while let Some((index, id, has)) = lines.next_id()? {
        if has.is_some() && dups.contains(&id) {
            match at.iter_mut().find(|(seen, _)| *seen == id) {
                Some((_, l)) => l.push(index + 1),
                None => at.push((id, vec![index + 1])),
            }
        }
    }
    let shown: Vec<String> = at
        .iter()
        .take(20)
        .map(|(id, l)| {
            let lines: Vec<String> = l.iter().map(u64::to_string).collect();
            format!("`{id}` on lines {}", lines.join(", "))
        })
        .collect();
    let more = at.len().saturating_sub(20);
    let mut list = if more > 0 {
        format!("{} and {more} more", shown.join("; "))
    } else {
        shown.join("; ")
    };
    // An id that is one of its own line numbers may be a line without the field.
    if at.iter().any(|(id, l)| l.iter().any(|n| n.to_string() == *id)) {
        list.push_str(&format!(
            " (a line without `{}` is named by its line number: give it an id of its own)",
            options.id_field
        ));
    }
    Err(BatchError::Duplicates {
        path: options.input.display().to_string(),
        list,
    })
}

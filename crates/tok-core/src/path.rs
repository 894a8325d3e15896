//! Addresses of steps in an automation tree (`"2.then.0"`).
//!
//! A path is what a job and a `run_steps` row store to say which step they are
//! about, so it must survive a round trip through text exactly. It starts with
//! an index into the top-level list and continues with zero or more branch
//! hops: `then.<i>` / `else.<i>` into a condition's branches, or
//! `do.<iteration>.<i>` into a loop's body on a given iteration, or
//! `branches.<b>.<i>` into branch `b` of a `parallel` step, or
//! `items.<n>.<i>` into the `do` list of a `for_each` step for its item
//! `n`, or
//! `escalations.<l>.<i>` into a waiting step's escalation level, or
//! `compensate.<i>` into what undoes a step. Loop iterations are part of
//! the address, so every executed step of a run has its own path (and the
//! compensation of a step in a loop says which iteration it undoes).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// A path that is not of the form `0`, `2.then.0`, `1.else.3`, `3.do.5.0`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error(
        "invalid step path `{input}`: {reason}; expected an index followed by `then.<i>`, `else.<i>`, `do.<iteration>.<i>`, `branches.<b>.<i>`, `items.<n>.<i>`, `escalations.<l>.<i>` or `compensate.<i>` hops, like `2.then.0`, `3.do.5.0`, `1.branches.0.2`, `2.items.7.0` or `4.compensate.0`"
    )]
    Invalid { input: String, reason: String },
}

/// Which child list of a step a hop goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Branch {
    /// A condition's `then`.
    Then,
    /// A condition's `else`.
    Else,
    /// A loop's body on the given (0-based) iteration.
    Do(usize),
    /// Branch `b` (0-based) of a `parallel` step.
    Parallel(usize),
    /// The `do` list of a `for_each` step for its item `n` (0-based), run
    /// as a branch of its own.
    Item(usize),
    /// The steps of escalation level `l` (0-based) of a waiting step.
    Escalation(usize),
    /// A step's `compensate` steps: what undoes it.
    Compensate,
}

/// The address of one step (on one loop iteration) in a tree.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowPath {
    first: usize,
    hops: Vec<(Branch, usize)>,
}

impl FlowPath {
    /// The step at index `i` of the top-level list.
    pub fn root(i: usize) -> FlowPath {
        FlowPath {
            first: i,
            hops: Vec::new(),
        }
    }

    /// Index into the top-level list.
    pub fn first(&self) -> usize {
        self.first
    }

    /// The branch hops after the top-level index, outermost first.
    pub fn hops(&self) -> &[(Branch, usize)] {
        &self.hops
    }

    /// Index of the step within its own list.
    pub fn index(&self) -> usize {
        self.hops.last().map_or(self.first, |&(_, i)| i)
    }

    /// How many lists deep the step is (0 for a top-level step).
    pub fn depth(&self) -> usize {
        self.hops.len()
    }

    /// The hop that led to this step's list, or `None` for a top-level step.
    pub fn branch(&self) -> Option<Branch> {
        self.hops.last().map(|&(b, _)| b)
    }

    /// Goes one level down, into `branch` of this step, at index `i`.
    pub fn push(&mut self, branch: Branch, i: usize) {
        self.hops.push((branch, i));
    }

    /// The path of child `i` in `branch` of this step.
    pub fn child(&self, branch: Branch, i: usize) -> FlowPath {
        let mut p = self.clone();
        p.push(branch, i);
        p
    }

    /// The step that contains this one (the condition or loop), or `None`
    /// for a top-level step.
    pub fn parent(&self) -> Option<FlowPath> {
        let mut p = self.clone();
        p.hops.pop().map(|_| p)
    }

    /// The step at index `i` in the same list.
    pub fn sibling(&self, i: usize) -> FlowPath {
        let mut p = self.clone();
        match p.hops.last_mut() {
            Some((_, last)) => *last = i,
            None => p.first = i,
        }
        p
    }

    /// The innermost `parallel` step this step runs in a branch of, or
    /// `for_each` step it runs in an item of, and that branch (item);
    /// `None` outside every branch.
    pub fn innermost_branch(&self) -> Option<(FlowPath, usize)> {
        if self.compensated().is_some() {
            // Compensation runs on the run's one job, after its branches.
            return None;
        }
        let k = self
            .hops
            .iter()
            .rposition(|(branch, _)| matches!(branch, Branch::Parallel(_) | Branch::Item(_)))?;
        let (Branch::Parallel(b) | Branch::Item(b)) = self.hops[k].0 else {
            return None;
        };
        let parallel = FlowPath {
            first: self.first,
            hops: self.hops[..k].to_vec(),
        };
        Some((parallel, b))
    }

    /// The step whose `compensate` steps this one is (or runs inside),
    /// or `None` outside every compensation.
    pub fn compensated(&self) -> Option<FlowPath> {
        let k = self
            .hops
            .iter()
            .position(|(branch, _)| *branch == Branch::Compensate)?;
        Some(FlowPath {
            first: self.first,
            hops: self.hops[..k].to_vec(),
        })
    }

    /// Whether this step is `ancestor` or runs inside it.
    pub fn is_within(&self, ancestor: &FlowPath) -> bool {
        self.first == ancestor.first && self.hops.starts_with(&ancestor.hops)
    }

    /// Every enclosing step with the branch taken out of it, outermost first.
    /// Loops among them appear as `Branch::Do(iteration)`.
    pub fn enclosing(&self) -> Vec<(FlowPath, Branch)> {
        (0..self.hops.len())
            .map(|k| {
                let ancestor = FlowPath {
                    first: self.first,
                    hops: self.hops[..k].to_vec(),
                };
                (ancestor, self.hops[k].0)
            })
            .collect()
    }
}

impl fmt::Display for FlowPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.first)?;
        for (branch, i) in &self.hops {
            match branch {
                Branch::Then => write!(f, ".then.{i}")?,
                Branch::Else => write!(f, ".else.{i}")?,
                Branch::Do(iteration) => write!(f, ".do.{iteration}.{i}")?,
                Branch::Parallel(b) => write!(f, ".branches.{b}.{i}")?,
                Branch::Item(n) => write!(f, ".items.{n}.{i}")?,
                Branch::Escalation(l) => write!(f, ".escalations.{l}.{i}")?,
                Branch::Compensate => write!(f, ".compensate.{i}")?,
            }
        }
        Ok(())
    }
}

impl FromStr for FlowPath {
    type Err = PathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| PathError::Invalid {
            input: s.to_owned(),
            reason,
        };
        let mut parts = s.split('.');
        let first = index(parts.next().unwrap_or(""), "the top-level index").map_err(invalid)?;
        let mut path = FlowPath::root(first);
        while let Some(word) = parts.next() {
            let branch = match word {
                "then" => Branch::Then,
                "else" => Branch::Else,
                "do" => {
                    let iteration = index(parts.next().unwrap_or(""), "the iteration after `do`")
                        .map_err(invalid)?;
                    Branch::Do(iteration)
                }
                "branches" => {
                    let b = index(parts.next().unwrap_or(""), "the branch after `branches`")
                        .map_err(invalid)?;
                    Branch::Parallel(b)
                }
                "items" => {
                    let n = index(parts.next().unwrap_or(""), "the item after `items`")
                        .map_err(invalid)?;
                    Branch::Item(n)
                }
                "escalations" => {
                    let l = index(parts.next().unwrap_or(""), "the level after `escalations`")
                        .map_err(invalid)?;
                    Branch::Escalation(l)
                }
                "compensate" => Branch::Compensate,
                other => {
                    return Err(invalid(format!(
                        "`{other}` is not `then`, `else`, `do`, `branches`, `items`, `escalations` or `compensate`"
                    )));
                }
            };
            let i =
                index(parts.next().unwrap_or(""), "the index after the branch").map_err(invalid)?;
            path.push(branch, i);
        }
        Ok(path)
    }
}

/// A canonical decimal index: digits only, no leading zero, so each path has
/// exactly one spelling.
fn index(text: &str, what: &str) -> Result<usize, String> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !canonical {
        return Err(format!("{what} must be a number, got `{text}`"));
    }
    text.parse()
        .map_err(|_| format!("{what} `{text}` is too large"))
}

impl Serialize for FlowPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FlowPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_and_parses_the_documented_forms() {
        for text in [
            "0",
            "2.then.0",
            "1.else.3",
            "3.do.5.0",
            "3.do.5.0.then.1",
            "2.branches.1.0",
            "2.branches.0.1.branches.3.0",
            "3.items.11.0",
            "1.items.0.2.then.0",
            "4.compensate.0",
            "3.do.2.1.compensate.1",
            "1.branches.0.2.compensate.0.then.0",
        ] {
            let p: FlowPath = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        let p: FlowPath = "3.do.5.0.then.1".parse().unwrap();
        assert_eq!(p.first(), 3);
        assert_eq!(p.hops(), &[(Branch::Do(5), 0), (Branch::Then, 1)]);
    }

    #[test]
    fn rejects_malformed_paths_with_the_input_in_the_message() {
        for bad in [
            "",
            "x",
            "1.",
            "1.then",
            "1.then.x",
            "1.do.2",
            "1.when.0",
            "01",
            "-1",
            "1..0",
            "1.branches.0",
            "1.branches.x.0",
            "1.compensate",
            "1.compensate.x",
        ] {
            let err = bad.parse::<FlowPath>().unwrap_err();
            assert!(
                err.to_string().contains(&format!("`{bad}`")),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn navigation_helpers() {
        let p = FlowPath::root(3)
            .child(Branch::Do(5), 0)
            .child(Branch::Then, 1);
        assert_eq!(p.index(), 1);
        assert_eq!(p.depth(), 2);
        assert_eq!(p.branch(), Some(Branch::Then));
        assert_eq!(p.parent().unwrap().to_string(), "3.do.5.0");
        assert_eq!(p.sibling(4).to_string(), "3.do.5.0.then.4");
        assert_eq!(FlowPath::root(2).sibling(3), FlowPath::root(3));
        assert_eq!(FlowPath::root(2).parent(), None);
        let enclosing: Vec<String> = p
            .enclosing()
            .iter()
            .map(|(a, b)| format!("{a}:{b:?}"))
            .collect();
        assert_eq!(enclosing, ["3:Do(5)", "3.do.5.0:Then"]);
    }

    #[test]
    fn a_compensation_names_the_step_it_undoes_and_is_in_no_branch() {
        let p: FlowPath = "1.branches.0.2.compensate.0.then.0".parse().unwrap();
        assert_eq!(p.compensated().unwrap().to_string(), "1.branches.0.2");
        assert_eq!(p.innermost_branch(), None);
        let q: FlowPath = "1.branches.0.2".parse().unwrap();
        assert_eq!(q.compensated(), None);
        assert_eq!(q.innermost_branch().unwrap().0.to_string(), "1");
    }

    #[test]
    fn serializes_as_its_text() {
        let p: FlowPath = "1.else.2".parse().unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"1.else.2\"");
        let back: FlowPath = serde_json::from_str("\"1.else.2\"").unwrap();
        assert_eq!(back, p);
        assert!(serde_json::from_str::<FlowPath>("\"1.then\"").is_err());
    }
}

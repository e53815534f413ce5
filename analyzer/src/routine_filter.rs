//! Which routines a call-graph view leaves out, with all they call:
//! `--exclude` globs (ftrace's `set_graph_notrace`, uftrace's `-N`) and
//! the hooks every kernel function calls, hidden unless asked for.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use rustc_hash::FxHashMap;

use crate::naming::routine_name;
use vtrace_image::symbols::{FuncId, Symbolizer, UNKNOWN_FUNC};

/// Routines hidden by default: the entry hooks a kernel built with
/// ftrace calls first in every function (`__fentry__`, `mcount`), and the
/// return and indirect-branch thunks of a kernel built with mitigations
/// (the level engine folds those into the routines around them already;
/// they are here for symbols it does not know as thunks).
pub const HIDDEN_BY_DEFAULT: &[&str] = &[
    "__fentry__",
    "mcount",
    "__x86_return_thunk",
    "__x86_indirect_thunk_*",
    "__x86_indirect_call_thunk_*",
    "__x86_indirect_jump_thunk_*",
    "srso_*return_thunk",
];

/// A `--exclude` pattern that is not a glob.
#[derive(Debug, thiserror::Error)]
#[error("--exclude {pattern:?}: {reason}")]
pub struct BadPattern {
    /// The pattern.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Routine names to leave out. Each routine is matched once; the answer
/// is kept by its id. The default leaves out nothing.
#[derive(Clone, Debug, Default)]
pub struct RoutineFilter {
    globs: GlobSet,
    known: FxHashMap<FuncId, bool>,
}

impl RoutineFilter {
    /// Leaves out routines matching any of `patterns` (`*`, `?`, `[...]`
    /// globs, matched against the whole name) and, with `defaults`,
    /// [`HIDDEN_BY_DEFAULT`].
    pub fn new(patterns: &[String], defaults: bool) -> Result<RoutineFilter, BadPattern> {
        let mut set = GlobSetBuilder::new();
        let defaults = HIDDEN_BY_DEFAULT.iter().filter(|_| defaults);
        for pattern in patterns.iter().map(String::as_str).chain(defaults.copied()) {
            let glob = GlobBuilder::new(pattern)
                .literal_separator(false)
                .backslash_escape(true)
                .build()
                .map_err(|e| BadPattern {
                    pattern: pattern.to_string(),
                    reason: e.kind().to_string(),
                })?;
            set.add(glob);
        }
        let globs = set.build().map_err(|e| BadPattern {
            pattern: patterns.join(" "),
            reason: e.to_string(),
        })?;
        Ok(RoutineFilter {
            globs,
            known: FxHashMap::default(),
        })
    }

    /// Leaves out nothing.
    pub fn none() -> RoutineFilter {
        RoutineFilter::default()
    }

    /// Whether it leaves out anything.
    pub fn is_empty(&self) -> bool {
        self.globs.is_empty()
    }

    /// Whether a routine of this name is left out.
    pub fn excludes_name(&self, name: &str) -> bool {
        !self.globs.is_empty() && self.globs.is_match(name)
    }

    /// Whether the routine `func` (entered at `pc`) is left out. Code no
    /// symbol names is never left out: its name is only its address.
    pub fn excludes(&mut self, symbols: &Symbolizer, func: FuncId, pc: u64) -> bool {
        if self.globs.is_empty() || func == UNKNOWN_FUNC {
            return false;
        }
        let globs = &self.globs;
        *self
            .known
            .entry(func)
            .or_insert_with(|| globs.is_match(routine_name(symbols, func, pc)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_image::symbols::{Scope, Symbol, SymbolTable};

    fn symbols(names: &[&str]) -> Symbolizer {
        let table = SymbolTable::new(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| Symbol {
                    start: 0x1000 * (i as u64 + 1),
                    size: 0x100,
                    name: n.to_string(),
                })
                .collect(),
            Some(0x1000 * (names.len() as u64 + 1)),
        );
        let mut s = Symbolizer::new();
        s.add("test", Scope::Any, table, None);
        s
    }

    fn excluded(filter: &mut RoutineFilter, symbols: &Symbolizer) -> Vec<String> {
        (0..3)
            .map(|i| 0x1000 * (i + 1))
            .filter_map(|pc| {
                let func = symbols.resolve(pc, 0)?.func;
                filter
                    .excludes(symbols, func, pc)
                    .then(|| symbols.name(func).to_string())
            })
            .collect()
    }

    #[test]
    fn globs_match_whole_names_and_the_hooks_hide_by_default() {
        let s = symbols(&["__fentry__", "rcu_read_lock", "do_rcu_thing"]);
        let mut defaults = RoutineFilter::new(&[], true).unwrap();
        assert_eq!(excluded(&mut defaults, &s), ["__fentry__"]);
        let mut rcu = RoutineFilter::new(&["rcu_*".into()], false).unwrap();
        assert_eq!(excluded(&mut rcu, &s), ["rcu_read_lock"]);
        let mut both = RoutineFilter::new(&["*rcu*".into()], true).unwrap();
        assert_eq!(
            excluded(&mut both, &s),
            ["__fentry__", "rcu_read_lock", "do_rcu_thing"]
        );
        assert!(excluded(&mut RoutineFilter::none(), &s).is_empty());
        // Unnamed code stays.
        assert!(!both.excludes(&s, UNKNOWN_FUNC, 0x9000));
    }

    #[test]
    fn a_broken_glob_is_named_in_the_error() {
        let e = RoutineFilter::new(&["ok".into(), "[oops".into()], false).unwrap_err();
        assert_eq!(e.pattern, "[oops");
        assert!(e.to_string().contains("--exclude \"[oops\""), "{e}");
    }
}

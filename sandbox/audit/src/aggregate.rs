//! Denials aggregated by (layer, operation, path prefix), with counts and a few examples, so the
//! cost of a run does not grow with the number of denials (see [`super::limits`]).
//!
//! - A group is a layer, an operation and a path prefix: the directory for file paths (the path
//!   itself for make/remove operations, which name the directory), the address for network
//!   denials, `-` when there is neither.
//! - Each group keeps its count, first and last time, and up to [`EXAMPLES_PER_GROUP`] examples
//!   with distinct targets (path or address), each with its advice; every other denial is only
//!   counted ("aggregated").
//! - Past [`MAX_GROUPS`] groups, denials of new prefixes are counted in one folded group per
//!   (layer, operation) with prefix `*` (one example each); past [`MAX_FOLDED_GROUPS`] of those,
//!   in one catch-all group per layer.
//! - Every kept string is capped ([`super::limits::cap_field`]).

use std::collections::HashMap;
use std::path::Path;

use crate::limits::{
    EXAMPLES_PER_GROUP, MAX_ALLOW_RULE_BYTES, MAX_FOLDED_GROUPS, MAX_GROUPS, MAX_PATH_FIELD_BYTES,
    MAX_TEXT_FIELD_BYTES, cap_cow, cap_field, cap_opt,
};
use sandbox::denial::{Denial, Layer};

/// The prefix of folded groups (any path beyond [`MAX_GROUPS`] groups).
pub const FOLDED_PREFIX: &str = "*";
/// The operation of a layer's catch-all group (beyond [`MAX_FOLDED_GROUPS`] folded groups).
pub const CATCH_ALL_OPERATION: &str = "*";

/// One group of denials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Its number in the report (first-seen order, from 0).
    pub id: usize,
    /// The refusing layer.
    pub layer: Layer,
    /// The operation (capped).
    pub operation: String,
    /// The path prefix (capped), the address, `-`, or [`FOLDED_PREFIX`].
    pub prefix: String,
    /// Denials counted in the group.
    pub count: u64,
    /// Time of the first.
    pub first_seen: String,
    /// Time of the last.
    pub last_seen: String,
    /// Examples with distinct targets, in arrival order, with their advice.
    pub examples: Vec<Example>,
}

impl Group {
    /// The advice of the group's first example.
    pub fn allow_rule(&self) -> &str {
        self.examples
            .first()
            .map_or("", |example| example.denial.allow_rule.as_str())
    }

    /// Whether this group counts denials of prefixes beyond [`MAX_GROUPS`].
    pub fn folded(&self) -> bool {
        self.prefix == FOLDED_PREFIX
    }
}

/// One listed denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// Arrival order among all examples (the JSON-lines report lists them in this order).
    pub seq: u64,
    /// The denial, capped, with its advice.
    pub denial: Denial,
}

/// All groups of a run and the totals.
#[derive(Clone, Debug, Default)]
pub struct Aggregate {
    groups: Vec<Group>,
    /// `layer \0 operation \0 prefix` → group (one string: looked up without copies).
    index: HashMap<String, usize>,
    /// `layer \0 operation` → folded group.
    folded: HashMap<String, usize>,
    prefixed_groups: usize,
    total: u64,
    listed: u64,
}

impl Aggregate {
    /// An empty aggregate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `denial`; when it becomes an example, fills in its advice (`advise`, called only
    /// then: a policy lookup per example, not per denial) and returns it with its group's id (to
    /// be written out as it arrives).
    pub fn add(
        &mut self,
        denial: Denial,
        advise: impl FnOnce(&Denial) -> String,
    ) -> Option<(usize, &Denial)> {
        self.total += 1;
        let operation = cap_cow(&denial.operation, MAX_TEXT_FIELD_BYTES);
        let prefix = group_prefix(&denial);
        let prefix = cap_cow(&prefix, MAX_PATH_FIELD_BYTES);
        let at = self.group_for(denial.layer, &operation, &prefix, &denial.time);
        let group = &mut self.groups[at];
        group.count += 1;
        let limit = if group.folded() {
            1
        } else {
            EXAMPLES_PER_GROUP
        };
        let mut example = None;
        if group.examples.len() < limit {
            let path = cap_opt(denial.path.clone(), MAX_PATH_FIELD_BYTES);
            let address = cap_opt(denial.address.clone(), MAX_TEXT_FIELD_BYTES);
            let seen = group
                .examples
                .iter()
                .any(|e| e.denial.path == path && e.denial.address == address);
            if !seen {
                let allow_rule = cap_field(&advise(&denial), MAX_ALLOW_RULE_BYTES);
                example = Some(Denial {
                    time: cap_field(&denial.time, MAX_TEXT_FIELD_BYTES),
                    pid: denial.pid,
                    exe: cap_opt(denial.exe.clone(), MAX_TEXT_FIELD_BYTES),
                    layer: denial.layer,
                    operation: group.operation.clone(),
                    path,
                    address,
                    syscall: cap_opt(denial.syscall.clone(), MAX_TEXT_FIELD_BYTES),
                    errno: cap_opt(denial.errno.clone(), MAX_TEXT_FIELD_BYTES),
                    allow_rule,
                });
            }
        }
        group.last_seen = cap_field(&denial.time, MAX_TEXT_FIELD_BYTES);
        let denial = example?;
        let seq = self.listed;
        self.listed += 1;
        let group = &mut self.groups[at];
        group.examples.push(Example { seq, denial });
        let id = group.id;
        group.examples.last().map(|e| (id, &e.denial))
    }

    fn group_for(&mut self, layer: Layer, operation: &str, prefix: &str, time: &str) -> usize {
        let key = format!("{}\0{operation}\0{prefix}", layer.as_str());
        if let Some(at) = self.index.get(&key) {
            return *at;
        }
        if self.prefixed_groups < MAX_GROUPS {
            self.prefixed_groups += 1;
            let at = self.push_group(layer, operation, prefix, time);
            self.index.insert(key, at);
            return at;
        }
        let mut key = format!("{}\0{operation}", layer.as_str());
        let mut operation = operation;
        if self.folded.len() >= MAX_FOLDED_GROUPS && !self.folded.contains_key(&key) {
            operation = CATCH_ALL_OPERATION;
            key = format!("{}\0{operation}", layer.as_str());
        }
        if let Some(at) = self.folded.get(&key) {
            return *at;
        }
        let at = self.push_group(layer, operation, FOLDED_PREFIX, time);
        self.folded.insert(key, at);
        at
    }

    fn push_group(&mut self, layer: Layer, operation: &str, prefix: &str, time: &str) -> usize {
        let id = self.groups.len();
        let time = cap_field(time, MAX_TEXT_FIELD_BYTES);
        self.groups.push(Group {
            id,
            layer,
            operation: operation.to_owned(),
            prefix: prefix.to_owned(),
            count: 0,
            first_seen: time.clone(),
            last_seen: time,
            examples: Vec::new(),
        });
        id
    }

    /// The groups, in first-seen order.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// Every denial counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Denials listed one by one (the examples).
    pub fn listed(&self) -> u64 {
        self.listed
    }

    /// Denials only counted in their group.
    pub fn aggregated(&self) -> u64 {
        self.total - self.listed
    }

    /// Groups that count denials of prefixes beyond [`MAX_GROUPS`].
    pub fn folded_groups(&self) -> usize {
        self.groups.iter().filter(|g| g.folded()).count()
    }

    /// Every example with its group id, in arrival order.
    pub fn examples(&self) -> Vec<(usize, &Denial)> {
        let mut all: Vec<(u64, usize, &Denial)> = self
            .groups
            .iter()
            .flat_map(|g| g.examples.iter().map(move |e| (e.seq, g.id, &e.denial)))
            .collect();
        all.sort_by_key(|(seq, _, _)| *seq);
        all.into_iter().map(|(_, id, d)| (id, d)).collect()
    }

    /// The layers that refused something, sorted.
    pub fn layers(&self) -> Vec<Layer> {
        let mut layers: Vec<Layer> = self.groups.iter().map(|g| g.layer).collect();
        layers.sort();
        layers.dedup();
        layers
    }
}

/// The prefix a denial is grouped under: the directory for file paths (Landlock already names
/// the directory for make/remove operations), the address otherwise, `-` without either.
pub fn group_prefix(denial: &Denial) -> String {
    match denial.path.as_deref() {
        Some(path) => {
            let names_dir = denial.operation.starts_with("fs.make_")
                || denial.operation.starts_with("fs.remove_")
                || denial.operation == "fs.refer";
            let dir = if names_dir {
                Path::new(path)
            } else {
                Path::new(path).parent().unwrap_or(Path::new(path))
            };
            let dir = dir.display().to_string();
            if dir.ends_with('/') {
                dir
            } else {
                format!("{dir}/")
            }
        }
        None => denial.address.clone().unwrap_or_else(|| "-".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn denial(layer: Layer, op: &str, path: Option<&str>) -> Denial {
        Denial {
            time: "2025-01-01T00:00:00.000Z".to_owned(),
            pid: Some(10),
            exe: Some("/usr/bin/touch".to_owned()),
            layer,
            operation: op.to_owned(),
            path: path.map(str::to_owned),
            address: None,
            syscall: Some("openat".to_owned()),
            errno: None,
            allow_rule: String::new(),
        }
    }

    /// Stands in for the advisor: names the directory a denial would need.
    fn advisor() -> impl Fn(&Denial) -> String {
        |d: &Denial| format!("\"{}\" = \"write\"", group_prefix(d).trim_end_matches('/'))
    }

    #[test]
    fn denials_are_grouped_by_layer_operation_and_directory_with_distinct_examples() {
        let advisor = advisor();
        let mut aggregate = Aggregate::new();
        let mut streamed = Vec::new();
        for i in 0..10 {
            let path = format!("/out/f{}", i % 6);
            if let Some((id, d)) =
                aggregate.add(denial(Layer::Mount, "fs.write_file", Some(&path)), &advisor)
            {
                streamed.push((id, d.path.clone().unwrap()));
            }
        }
        aggregate.add(denial(Layer::Mount, "fs.make_dir", Some("/out")), &advisor);
        aggregate.add(denial(Layer::Seccomp, "socket", None), &advisor);
        aggregate.add(denial(Layer::Seccomp, "socket", None), &advisor);
        assert_eq!(
            streamed,
            vec![
                (0, "/out/f0".to_owned()),
                (0, "/out/f1".to_owned()),
                (0, "/out/f2".to_owned()),
                (0, "/out/f3".to_owned()),
            ]
        );
        let groups: Vec<(Layer, &str, &str, u64, usize)> = aggregate
            .groups()
            .iter()
            .map(|g| {
                (
                    g.layer,
                    g.operation.as_str(),
                    g.prefix.as_str(),
                    g.count,
                    g.examples.len(),
                )
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                (Layer::Mount, "fs.write_file", "/out/", 10, 4),
                (Layer::Mount, "fs.make_dir", "/out/", 1, 1),
                (Layer::Seccomp, "socket", "-", 2, 1),
            ]
        );
        assert_eq!(
            (
                aggregate.total(),
                aggregate.listed(),
                aggregate.aggregated()
            ),
            (13, 6, 7)
        );
        assert_eq!(aggregate.groups()[0].allow_rule(), "\"/out\" = \"write\"");
        let order: Vec<usize> = aggregate.examples().iter().map(|(id, _)| *id).collect();
        assert_eq!(order, vec![0, 0, 0, 0, 1, 2]);
    }

    #[test]
    fn prefixes_beyond_the_group_limit_are_folded_and_still_counted() {
        let advisor = advisor();
        let mut aggregate = Aggregate::new();
        let extra = 100;
        for i in 0..MAX_GROUPS + extra {
            let path = format!("/out/d{i}/f");
            aggregate.add(denial(Layer::Mount, "fs.write_file", Some(&path)), &advisor);
        }
        for i in 0..MAX_FOLDED_GROUPS + 10 {
            let op = format!("op{i}");
            aggregate.add(denial(Layer::Unexplained, &op, Some("/x/y")), &advisor);
        }
        assert_eq!(
            aggregate.total(),
            (MAX_GROUPS + extra + MAX_FOLDED_GROUPS + 10) as u64
        );
        let folded: Vec<(&str, u64)> = aggregate
            .groups()
            .iter()
            .filter(|g| g.folded())
            .map(|g| (g.operation.as_str(), g.count))
            .collect();
        assert_eq!(folded[0], ("fs.write_file", extra as u64));
        assert_eq!(folded.len(), MAX_FOLDED_GROUPS + 1);
        assert_eq!(folded.last(), Some(&(CATCH_ALL_OPERATION, 11)));
        let counted: u64 = aggregate.groups().iter().map(|g| g.count).sum();
        assert_eq!(counted, aggregate.total());
    }

    #[test]
    fn kept_fields_are_capped() {
        let advisor = advisor();
        let mut aggregate = Aggregate::new();
        let long = format!("/out/{}", "\u{1}".repeat(5000));
        let mut d = denial(Layer::Mount, "fs.write_file", Some(&long));
        d.exe = Some("\u{7}".repeat(10_000));
        let (_, example) = aggregate.add(d, &advisor).unwrap();
        let line = serde_json::to_string(example).unwrap();
        assert!(line.len() < 4 * 1024, "{}", line.len());
        assert!(example.exe.as_deref().unwrap().contains("…[+"));
    }
}

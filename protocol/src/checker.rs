//! An explicit-state model checker for the protocol model.
//!
//! Breadth-first search from `Init` over every action instance, with a hash
//! set of visited states, checks every [`Invariant`] in every reachable state
//! and returns a shortest counterexample on a violation. Liveness is checked
//! on the full state graph: for each leads-to `P ~> Q` it looks, among the
//! states where `Q` is false, for a strongly connected component that a
//! weakly fair behaviour can stay in forever (every fairness group that is
//! enabled in all its states is also taken inside it; a single state without
//! such a step is infinite stuttering) and that is reachable from a state where
//! `P` holds without passing through `Q`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::model::{Action, Config, FairnessGroup, Invariant, LivenessProperty, Mutation, State, check_invariants, step_mutated};

/// What to check.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// Which model to check: the real one or a mutant.
    pub mutation: Mutation,
    /// Also check the liveness properties (needs the whole state graph).
    pub liveness: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self { mutation: Mutation::None, liveness: true }
    }
}

/// A behaviour prefix: the initial state and each step taken from it.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The initial state.
    pub initial: State,
    /// Each action with the state it leads to.
    pub steps: Vec<(Action, State)>,
}

impl Trace {
    /// The actions of the trace, in order.
    pub fn actions(&self) -> Vec<Action> {
        self.steps.iter().map(|(action, _)| *action).collect()
    }

    /// The last state of the trace.
    pub fn last_state(&self) -> &State {
        self.steps.last().map_or(&self.initial, |(_, state)| state)
    }

    /// The actions written as in a TLC trace, one per line.
    pub fn describe(&self, config: &Config) -> String {
        let mut text = String::from("Init");
        for (action, _) in &self.steps {
            text.push_str("\n-> ");
            text.push_str(&action.display(config).to_string());
        }
        text
    }
}

/// A property the checker found violated.
#[derive(Clone, Debug)]
pub enum Violation {
    /// A reachable state breaks a safety invariant; `trace` ends in it.
    Invariant {
        /// The violated invariant.
        invariant: Invariant,
        /// A shortest behaviour from `Init` to the violating state.
        trace: Trace,
    },
    /// A fair behaviour never reaches the goal of a leads-to property.
    Liveness {
        /// The violated property instance.
        property: LivenessProperty,
        /// From `Init` to the first state of the fair cycle.
        prefix: Trace,
        /// Steps that return to the last state of `prefix`; empty when the
        /// behaviour stutters there forever.
        cycle: Vec<Action>,
    },
}

/// The result of one model-checking run.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// Distinct reachable states explored.
    pub states: usize,
    /// Transitions (state, action, different successor) explored.
    pub transitions: usize,
    /// Length of the longest shortest path from `Init`.
    pub depth: usize,
    /// Liveness property instances checked.
    pub liveness_checked: usize,
    /// How many transitions each TLA+ action (by name) contributed: shows
    /// which actions the configuration exercises.
    pub action_counts: BTreeMap<&'static str, usize>,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
    /// The first violation found, if any.
    pub violation: Option<Violation>,
}

/// Explores every reachable state of `config` and checks every invariant and,
/// if asked, every liveness property.
pub fn check(config: &Config, options: CheckOptions) -> CheckReport {
    let started = Instant::now();
    let actions = Action::all(config);
    let initial = State::initial(config);

    let mut index: HashMap<State, u32> = HashMap::new();
    let mut states: Vec<State> = Vec::new();
    // For each state: the state and action that first reached it.
    let mut parent: Vec<Option<(u32, u16)>> = Vec::new();
    let mut depth_of: Vec<u32> = Vec::new();
    let mut edges: Vec<Vec<(u32, u16)>> = Vec::new();
    let mut transitions = 0usize;
    let mut action_counts: BTreeMap<&'static str, usize> = BTreeMap::new();

    index.insert(initial.clone(), 0);
    states.push(initial);
    parent.push(None);
    depth_of.push(0);
    let mut queue = VecDeque::from([0u32]);

    let trace_to = |states: &[State], parent: &[Option<(u32, u16)>], mut at: u32| {
        let mut steps = Vec::new();
        while let Some((from, action)) = parent[at as usize] {
            steps.push((actions[action as usize], states[at as usize].clone()));
            at = from;
        }
        steps.reverse();
        Trace { initial: states[0].clone(), steps }
    };

    if let Err(invariant) = check_invariants(config, &states[0]) {
        return CheckReport {
            states: 1,
            transitions: 0,
            depth: 0,
            liveness_checked: 0,
            action_counts,
            elapsed: started.elapsed(),
            violation: Some(Violation::Invariant { invariant, trace: trace_to(&states, &parent, 0) }),
        };
    }

    while let Some(at) = queue.pop_front() {
        let mut out = Vec::new();
        for (action_index, action) in actions.iter().enumerate() {
            let Ok(next) = step_mutated(config, &states[at as usize], action, options.mutation) else {
                continue;
            };
            if next == states[at as usize] {
                // A stuttering step is not a step of `<<A>>_vars`.
                continue;
            }
            transitions += 1;
            *action_counts.entry(action.name()).or_default() += 1;
            let target = match index.get(&next) {
                Some(&known) => known,
                None => {
                    let id = u32::try_from(states.len()).unwrap_or(u32::MAX);
                    let violated = check_invariants(config, &next).err();
                    index.insert(next.clone(), id);
                    states.push(next);
                    parent.push(Some((at, action_index as u16)));
                    depth_of.push(depth_of[at as usize] + 1);
                    if let Some(invariant) = violated {
                        return CheckReport {
                            states: states.len(),
                            transitions,
                            depth: depth_of.iter().copied().max().unwrap_or(0) as usize,
                            liveness_checked: 0,
                            action_counts,
                            elapsed: started.elapsed(),
                            violation: Some(Violation::Invariant { invariant, trace: trace_to(&states, &parent, id) }),
                        };
                    }
                    queue.push_back(id);
                    id
                }
            };
            if options.liveness {
                out.push((target, action_index as u16));
            }
        }
        if options.liveness {
            if edges.len() <= at as usize {
                edges.resize(at as usize + 1, Vec::new());
            }
            edges[at as usize] = out;
        }
    }
    edges.resize(states.len(), Vec::new());

    let mut liveness_checked = 0;
    let mut violation = None;
    if options.liveness {
        let graph = Graph { config, actions: &actions, states: &states, edges: &edges };
        for property in LivenessProperty::all(config) {
            liveness_checked += 1;
            if let Some((start, path, cycle)) = graph.find_fair_lasso(property) {
                let mut prefix = trace_to(&states, &parent, start);
                for &(action, target) in &path {
                    prefix.steps.push((actions[action as usize], states[target as usize].clone()));
                }
                violation = Some(Violation::Liveness { property, prefix, cycle: cycle.iter().map(|&a| actions[a as usize]).collect() });
                break;
            }
        }
    }

    CheckReport {
        states: states.len(),
        transitions,
        depth: depth_of.iter().copied().max().unwrap_or(0) as usize,
        liveness_checked,
        action_counts,
        elapsed: started.elapsed(),
        violation,
    }
}

struct Graph<'a> {
    config: &'a Config,
    actions: &'a [Action],
    states: &'a [State],
    edges: &'a [Vec<(u32, u16)>],
}

/// A small bit set over fairness groups.
#[derive(Clone, PartialEq, Eq)]
struct Groups(Vec<u64>);

impl Groups {
    fn empty(size: usize) -> Self {
        Self(vec![0; size.div_ceil(64)])
    }
    fn full(size: usize) -> Self {
        let mut set = Self::empty(size);
        for i in 0..size {
            set.insert(i);
        }
        set
    }
    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn intersect(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a &= b;
        }
    }
    fn is_subset_of(&self, other: &Self) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & !b == 0)
    }
}

impl Graph<'_> {
    fn group_index(&self, group: FairnessGroup) -> usize {
        let (domains, sessions) = (self.config.domains.len(), self.config.sessions.len());
        match group {
            FairnessGroup::DomainProgress(d) => d.0,
            FairnessGroup::SessionProgress(s) => domains + s.0,
            FairnessGroup::RequestProgress(r) => domains + sessions + r.0,
        }
    }

    fn group_count(&self) -> usize {
        self.config.domains.len() + self.config.sessions.len() + self.config.requests.len()
    }

    fn group_of(&self, action: u16) -> Option<usize> {
        self.actions[action as usize].fairness_group().map(|g| self.group_index(g))
    }

    /// Fairness groups with a step from `state` (anywhere in the graph).
    fn enabled_groups(&self, state: u32) -> Groups {
        let mut set = Groups::empty(self.group_count());
        for &(_, action) in &self.edges[state as usize] {
            if let Some(g) = self.group_of(action) {
                set.insert(g);
            }
        }
        set
    }

    /// Looks for a fair behaviour violating `property`. Returns the state
    /// where the trigger holds, the path from there to a fair component, and
    /// a cycle in that component (empty: stuttering).
    #[allow(clippy::type_complexity)]
    fn find_fair_lasso(&self, property: LivenessProperty) -> Option<(u32, Vec<(u16, u32)>, Vec<u16>)> {
        let n = self.states.len();
        let in_region: Vec<bool> = self.states.iter().map(|s| !property.goal(self.config, s)).collect();
        let component = self.components(&in_region);

        // Fair components: every group enabled in all their states is taken
        // by a step inside them.
        let component_count = component.iter().filter_map(|c| *c).max().map_or(0, |m| m + 1);
        let groups = self.group_count();
        let mut enabled_everywhere = vec![Groups::full(groups); component_count as usize];
        let mut taken_inside = vec![Groups::empty(groups); component_count as usize];
        for u in 0..n {
            let Some(c) = component[u] else { continue };
            enabled_everywhere[c as usize].intersect(&self.enabled_groups(u as u32));
            for &(v, action) in &self.edges[u] {
                if component[v as usize] == Some(c) {
                    if let Some(g) = self.group_of(action) {
                        taken_inside[c as usize].insert(g);
                    }
                }
            }
        }
        let fair: Vec<bool> = (0..component_count as usize).map(|c| enabled_everywhere[c].is_subset_of(&taken_inside[c])).collect();

        // States of the region from which a fair component is reachable
        // inside the region: backward search from the fair components.
        let mut reverse: Vec<Vec<u32>> = vec![Vec::new(); n];
        for u in 0..n {
            if !in_region[u] {
                continue;
            }
            for &(v, _) in &self.edges[u] {
                if in_region[v as usize] {
                    reverse[v as usize].push(u as u32);
                }
            }
        }
        let mut reaches_fair = vec![false; n];
        let mut queue: VecDeque<u32> = VecDeque::new();
        for u in 0..n {
            if component[u].is_some_and(|c| fair[c as usize]) {
                reaches_fair[u] = true;
                queue.push_back(u as u32);
            }
        }
        while let Some(v) = queue.pop_front() {
            for &u in &reverse[v as usize] {
                if !reaches_fair[u as usize] {
                    reaches_fair[u as usize] = true;
                    queue.push_back(u);
                }
            }
        }

        // The first trigger state (in BFS order: shortest prefix) that can
        // reach a fair component, and the shortest way there.
        for (start, state) in self.states.iter().enumerate() {
            if !reaches_fair[start] || !property.trigger(self.config, state) {
                continue;
            }
            if let Some((path, end)) = self.path_to(start as u32, &in_region, |v| component[v as usize].is_some_and(|c| fair[c as usize])) {
                let c = component[end as usize];
                let cycle = self.cycle_in(end, |v| component[v as usize] == c);
                return Some((start as u32, path, cycle));
            }
        }
        None
    }

    /// Strongly connected components (iterative Tarjan) of the subgraph of
    /// states with `in_region` set.
    fn components(&self, in_region: &[bool]) -> Vec<Option<u32>> {
        let n = self.states.len();
        let mut index = vec![u32::MAX; n];
        let mut low = vec![0u32; n];
        let mut on_stack = vec![false; n];
        let mut component = vec![None; n];
        let mut stack: Vec<u32> = Vec::new();
        let mut next_index = 0u32;
        let mut next_component = 0u32;
        for root in 0..n {
            if !in_region[root] || index[root] != u32::MAX {
                continue;
            }
            // Call stack of (state, next edge to look at).
            let mut calls: Vec<(u32, usize)> = vec![(root as u32, 0)];
            index[root] = next_index;
            low[root] = next_index;
            next_index += 1;
            stack.push(root as u32);
            on_stack[root] = true;
            while let Some(&(u, edge)) = calls.last() {
                let u_edges = &self.edges[u as usize];
                if edge < u_edges.len() {
                    let (v, _) = u_edges[edge];
                    if let Some(top) = calls.last_mut() {
                        top.1 += 1;
                    }
                    let v_us = v as usize;
                    if !in_region[v_us] {
                        continue;
                    }
                    if index[v_us] == u32::MAX {
                        index[v_us] = next_index;
                        low[v_us] = next_index;
                        next_index += 1;
                        stack.push(v);
                        on_stack[v_us] = true;
                        calls.push((v, 0));
                    } else if on_stack[v_us] {
                        low[u as usize] = low[u as usize].min(index[v_us]);
                    }
                } else {
                    calls.pop();
                    if let Some(&(parent, _)) = calls.last() {
                        low[parent as usize] = low[parent as usize].min(low[u as usize]);
                    }
                    if low[u as usize] == index[u as usize] {
                        while let Some(w) = stack.pop() {
                            on_stack[w as usize] = false;
                            component[w as usize] = Some(next_component);
                            if w == u {
                                break;
                            }
                        }
                        next_component += 1;
                    }
                }
            }
        }
        component
    }

    /// Shortest path inside the region from `start` to a state satisfying
    /// `target` (possibly `start` itself).
    fn path_to(&self, start: u32, in_region: &[bool], target: impl Fn(u32) -> bool) -> Option<(Vec<(u16, u32)>, u32)> {
        let mut came_from: HashMap<u32, (u32, u16)> = HashMap::new();
        let mut queue = VecDeque::from([start]);
        let mut seen = std::collections::HashSet::from([start]);
        while let Some(u) = queue.pop_front() {
            if target(u) {
                let mut path = Vec::new();
                let mut at = u;
                while let Some(&(from, action)) = came_from.get(&at) {
                    path.push((action, at));
                    at = from;
                }
                path.reverse();
                return Some((path, u));
            }
            for &(v, action) in &self.edges[u as usize] {
                if in_region[v as usize] && seen.insert(v) {
                    came_from.insert(v, (u, action));
                    queue.push_back(v);
                }
            }
        }
        None
    }

    /// A cycle from `at` back to `at` through states satisfying `inside`, or
    /// empty if there is none (the behaviour stutters at `at`).
    fn cycle_in(&self, at: u32, inside: impl Fn(u32) -> bool) -> Vec<u16> {
        let mut came_from: HashMap<u32, (u32, u16)> = HashMap::new();
        let mut queue = VecDeque::new();
        for &(v, action) in &self.edges[at as usize] {
            if inside(v) && !came_from.contains_key(&v) {
                came_from.insert(v, (at, action));
                queue.push_back(v);
            }
        }
        while let Some(u) = queue.pop_front() {
            if u == at {
                let mut cycle = Vec::new();
                let mut cur = at;
                while let Some(&(from, action)) = came_from.get(&cur) {
                    cycle.push(action);
                    cur = from;
                    if cur == at {
                        break;
                    }
                }
                cycle.reverse();
                return cycle;
            }
            for &(v, action) in &self.edges[u as usize] {
                if inside(v) && !came_from.contains_key(&v) {
                    came_from.insert(v, (u, action));
                    queue.push_back(v);
                }
            }
        }
        Vec::new()
    }
}

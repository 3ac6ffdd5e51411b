//! Chaining: the vertices in topological order, and the chains of them that become
//! tasks.

use anyhow::{Result, bail};

use super::graph::{ChainInput, ChainSpec, Edge, JobGraph, Vertex};
use crate::network::Partitioner;

impl JobGraph {
    /// Recomputes the chains after vertices or edges changed (a unit of a job spread
    /// over several hosts runs part of its graph).
    pub(crate) fn rechain(&mut self) -> Result<()> {
        let order = topological_order(&self.vertices, &self.edges)?;
        self.chains = chain(&self.vertices, &self.edges, &order);
        Ok(())
    }
}

/// The vertices in an order where each comes after everything it reads, sources first;
/// or an error naming the vertices on a cycle.
pub(super) fn topological_order(vertices: &[Vertex], edges: &[Edge]) -> Result<Vec<usize>> {
    let mut pending: Vec<usize> = vec![0; vertices.len()];
    for e in edges {
        pending[e.to] += 1;
    }
    let mut ready: std::collections::VecDeque<usize> =
        (0..vertices.len()).filter(|&v| pending[v] == 0).collect();
    let mut order = Vec::with_capacity(vertices.len());
    while let Some(v) = ready.pop_front() {
        order.push(v);
        for e in edges.iter().filter(|e| e.from == v) {
            pending[e.to] -= 1;
            if pending[e.to] == 0 {
                ready.push_back(e.to);
            }
        }
    }
    if order.len() < vertices.len() {
        // Every vertex left waits for an input from another one left: walking back
        // along such inputs must come round to a vertex seen before.
        let left = |v: usize| pending[v] > 0;
        let mut path = vec![(0..vertices.len()).find(|&v| left(v)).expect("one is left")];
        let start = loop {
            let v = *path.last().expect("not empty");
            let from = edges
                .iter()
                .find(|e| e.to == v && left(e.from))
                .expect("a vertex left waits for another")
                .from;
            if let Some(i) = path.iter().position(|&p| p == from) {
                break i;
            }
            path.push(from);
        };
        let mut cycle: Vec<String> = path[start..]
            .iter()
            .rev()
            .map(|&v| vertices[v].describe())
            .collect();
        cycle.push(cycle[0].clone());
        bail!("the job's graph has a cycle: {}", cycle.join(" -> "));
    }
    Ok(order)
}

/// The tasks: a vertex joins the chain of the vertex it reads when that is its only
/// input, a forward edge from a main output, and that vertex's only reader (Flink chains
/// the same way, and also an operator with several forward readers: here a fan-out or a
/// side output read by anyone ends a chain, so that a chain is a line and only its tail
/// has several outputs). Every other edge crosses channels between tasks.
pub(super) fn chain(vertices: &[Vertex], edges: &[Edge], order: &[usize]) -> Vec<ChainSpec> {
    let mut chains: Vec<ChainSpec> = Vec::new();
    let mut chain_of = vec![usize::MAX; vertices.len()];
    for &v in order {
        let inputs: Vec<&Edge> = edges.iter().filter(|e| e.to == v).collect();
        if let [e] = inputs[..]
            && e.side.is_none()
            && e.partitioner == Partitioner::Forward
            && edges.iter().filter(|x| x.from == e.from).count() == 1
        {
            let c = chain_of[e.from];
            chains[c].vertices.push(v);
            chain_of[v] = c;
            continue;
        }
        chain_of[v] = chains.len();
        chains.push(ChainSpec {
            vertices: vec![v],
            parallelism: vertices[v].parallelism(),
            inputs: inputs
                .iter()
                .map(|e| ChainInput {
                    from: chain_of[e.from],
                    side: e.side.clone(),
                    input: e.input,
                    partitioner: e.partitioner.clone(),
                })
                .collect(),
        });
    }
    chains
}

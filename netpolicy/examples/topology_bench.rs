//! Build and teardown time of one Domain's topology (median and p90 over 20
//! runs), entirely inside a test host namespace this program creates.
//! Needs root: `cargo run -p lazaret-netpolicy --example topology_bench`.

#![forbid(unsafe_code)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use lazaret_netpolicy::policy::{PolicyInput, parse_prefixes};
use lazaret_netpolicy::topology::{DomainNetwork, TopologyConfig};
use rtnetlink::LinkVeth;

const RUNS: usize = 20;

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Builds and tears down one Domain topology RUNS times; the sorted timings.
fn measure(net: &support::FakeInternet, input: &PolicyInput) -> (Vec<Duration>, Vec<Duration>) {
    let config = TopologyConfig::new(net.state_file());
    let mut builds = Vec::with_capacity(RUNS);
    let mut teardowns = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        let start = Instant::now();
        let domain = DomainNetwork::create(&net.host, &config, input).unwrap_or_else(|e| panic!("run {run}: {e}"));
        builds.push(start.elapsed());
        let start = Instant::now();
        domain.teardown().unwrap_or_else(|e| panic!("run {run}: teardown: {e}"));
        teardowns.push(start.elapsed());
    }
    builds.sort();
    teardowns.sort();
    (builds, teardowns)
}

fn main() {
    let net = support::FakeInternet::with_ipv6();
    let mut input = PolicyInput {
        allow: parse_prefixes(&[("10.222.0.0/16", "bench:1:1")]).expect("prefix"),
        dns: vec![IpAddr::V4(support::RESOLVER)],
        ..PolicyInput::default()
    };
    let (builds, teardowns) = measure(&net, &input);
    input.ipv6 = true;
    let (builds6, teardowns6) = measure(&net, &input);
    // The kernel's floor for a teardown: deleting one veth pair (its RCU
    // barrier dominates), measured the same way in the same namespace.
    let mut veth_deletes = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        let elapsed = net
            .host
            .netlink(async |handle| {
                handle.link().add(LinkVeth::new("lzbench0", "lzbench1").build()).execute().await.map_err(support::nl("veth"))?;
                let index = support::link_index_sync(&support::links(&handle).await?, "lzbench0");
                let start = Instant::now();
                handle.link().del(index).execute().await.map_err(support::nl("delete veth"))?;
                Ok(start.elapsed())
            })
            .unwrap_or_else(|e| panic!("run {run}: veth floor: {e}"));
        veth_deletes.push(elapsed);
    }
    veth_deletes.sort();
    let line = |what: &str, samples: &[Duration]| {
        println!("  {what:<24} median {:>8.2?}  p90 {:>8.2?}", percentile(samples, 0.5), percentile(samples, 0.9));
    };
    println!("Domain topology, {RUNS} runs each, includes read-back verification:");
    line("build, IPv6 disabled", &builds);
    line("teardown, IPv6 disabled", &teardowns);
    line("build, IPv6 enabled", &builds6);
    line("teardown, IPv6 enabled", &teardowns6);
    line("(kernel: one veth delete)", &veth_deletes);
}

//! Manual check: `cargo run -p lazaret-oci --example import -- STORE NAME SOURCE`
//! imports SOURCE into the store at STORE and prints the record and the time taken.

#![forbid(unsafe_code)]

use std::path::Path;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, store, name, source] = args.as_slice() else {
        return Err("usage: import STORE NAME SOURCE".into());
    };
    let store = lazaret_oci::ImageStore::open(Path::new(store))?;
    let started = Instant::now();
    let record = store.import(name, Path::new(source))?;
    let elapsed = started.elapsed();
    println!("{record:#?}");
    println!("imported in {:.2} s", elapsed.as_secs_f64());
    Ok(())
}

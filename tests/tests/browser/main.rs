//! The browser tier: the harness of `proxyfleet_tests::browser` (headless
//! Chromium under chromedriver, axe-core) against small pages served from
//! loopback under the console's strict Content-Security-Policy, and the
//! docs site as `cargo xtask book` builds it. One module per area.
//!
//! Needs the `browser` feature, Debian's chromium and chromium-driver, and
//! axe-core at the path `PROXYFLEET_AXE` names: `cargo test -p
//! proxyfleet-tests --features browser --test browser` (the README's test
//! command provides them and runs every tier).

mod accessibility;
mod docs_site;
mod scripts;
mod site;
mod viewport;

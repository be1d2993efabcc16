//! A plugin's declaration of the oldest host it runs on: the custom
//! section `proxyfleet-min-host-version`, a version such as `0.2.0` in
//! UTF-8, in the component or in one of its core modules (where the SDK's
//! `min_host_version!` puts it). Hosts that predate the declaration skip
//! custom sections, so a build that declares one still loads there as
//! before; a host older than the version declared refuses the build at
//! load, before compiling it, naming both versions.

use std::path::Path;

use crate::error::LoadError;

/// The custom section's name.
pub const SECTION: &str = "proxyfleet-min-host-version";
/// This host's version: the release the runtime is part of.
pub const HOST_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The longest version read: a longer section is no version.
const MAX_SECTION_BYTES: usize = 64;

/// The highest version the component at `path` declares, if any; an
/// error when the host is older, or a section holds no version.
pub(crate) fn check(path: &Path, bytes: &[u8]) -> Result<Option<semver::Version>, LoadError> {
    let declared =
        declared(bytes).map_err(|message| LoadError::Invalid { path: path.to_owned(), message })?;
    let Some(needs) = declared else { return Ok(None) };
    let host = semver::Version::parse(HOST_VERSION).expect("the crate's own version parses");
    if needs > host {
        return Err(LoadError::NeedsNewerHost {
            path: path.to_owned(),
            needs: needs.to_string(),
            host: HOST_VERSION,
        });
    }
    Ok(Some(needs))
}

/// Every `proxyfleet-min-host-version` section, at any depth, read; the
/// highest version. A file that is no valid WebAssembly declares
/// nothing here: compiling it names what is wrong.
fn declared(bytes: &[u8]) -> Result<Option<semver::Version>, String> {
    let mut highest: Option<semver::Version> = None;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { return Ok(highest) };
        let wasmparser::Payload::CustomSection(section) = payload else { continue };
        if section.name() != SECTION {
            continue;
        }
        let data = section.data();
        let text = std::str::from_utf8(data)
            .ok()
            .filter(|_| data.len() <= MAX_SECTION_BYTES)
            .map(str::trim);
        let version = text.and_then(|text| semver::Version::parse(text).ok()).ok_or_else(|| {
            format!(
                "its custom section {SECTION} holds {:?}, not a version such as 0.2.0: \
                 declare it with proxyfleet_sdk::min_host_version!(\"0.2.0\")",
                String::from_utf8_lossy(&data[..data.len().min(MAX_SECTION_BYTES)])
            )
        })?;
        if highest.as_ref().is_none_or(|highest| version > *highest) {
            highest = Some(version);
        }
    }
    Ok(highest)
}

/// `component` declaring `version` as the oldest host it runs on: the
/// section appended at the top level, for components built without the
/// Rust SDK (componentize-py, jco) or after the fact.
pub fn declare(component: &[u8], version: &semver::Version) -> Vec<u8> {
    with_section(component, SECTION, version.to_string().as_bytes())
}

/// `component` with a top-level custom section `name` holding `data`
/// appended (id 0, its size, the name's length and the name, the data).
fn with_section(component: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    let mut section = Vec::new();
    leb128(&mut section, name.len());
    section.extend_from_slice(name.as_bytes());
    section.extend_from_slice(data);
    let mut out = component.to_vec();
    out.push(0);
    leb128(&mut out, section.len());
    out.extend_from_slice(&section);
    out
}

fn leb128(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = u8::try_from(value & 0x7f).unwrap_or_default();
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: the preamble, nothing else.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn no_section_declares_nothing() {
        assert_eq!(declared(EMPTY_COMPONENT), Ok(None));
        assert_eq!(declared(b"not wasm"), Ok(None));
    }

    #[test]
    fn the_highest_declaration_counts_and_an_older_host_is_refused_naming_both() {
        let one = with_section(EMPTY_COMPONENT, SECTION, b"0.1.0");
        let both = with_section(&one, SECTION, b"99.1.0");
        assert_eq!(declared(&one).unwrap().unwrap().to_string(), "0.1.0");
        assert_eq!(declared(&both).unwrap().unwrap().to_string(), "99.1.0");
        let err = check(Path::new("new.wasm"), &both).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("99.1.0") && text.contains(HOST_VERSION), "{text}");
        let other = with_section(EMPTY_COMPONENT, "producers-of-something", b"99.0.0");
        assert_eq!(check(Path::new("other.wasm"), &other).unwrap(), None);
    }

    #[test]
    fn a_section_that_holds_no_version_is_named_with_the_fix() {
        for data in [&b"soon"[..], &[0xff, 0xfe][..], &[b'1'; 200][..]] {
            let bytes = with_section(EMPTY_COMPONENT, SECTION, data);
            let err = check(Path::new("odd.wasm"), &bytes).unwrap_err().to_string();
            assert!(err.contains(SECTION) && err.contains("min_host_version!"), "{err}");
        }
    }
}

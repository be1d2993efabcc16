//! Proxy specs for tests, filled as the operator fills them.

use proxyfleet_sdk::{Network, ProxyAuth, ProxySpec};

/// The installation name specs carry.
pub const INSTALLATION: &str = "proxyfleet-test";

/// A spec for a Proxy `name` in namespace `default`, with the operator's
/// defaults (1 core, 512 MiB, 4 GiB, port 3128, image `debian-12`) and a
/// UID derived from the name, so that the same name gives the same UID in
/// every run. Change fields as a test needs.
pub fn spec(name: &str) -> ProxySpec {
    ProxySpec {
        installation: INSTALLATION.to_owned(),
        name: name.to_owned(),
        namespace: "default".to_owned(),
        uid: uid(name),
        cores: 1,
        memory_mib: 512,
        disk_gib: 4,
        image: "debian-12".to_owned(),
        placement: Vec::new(),
        network: Network { vlan_tag: None },
        port: 3128,
        user_data: Vec::new(),
        labels: Vec::new(),
        proxy_auth: None,
    }
}

/// [`spec`] with a proxy credential: user `crawler` and a password derived
/// from the name, long enough that [`crate::TestKit::verify`] finds it
/// wherever the plugin lets it slip.
pub fn spec_with_auth(name: &str) -> ProxySpec {
    ProxySpec {
        proxy_auth: Some(ProxyAuth {
            username: "crawler".to_owned(),
            password: format!("pw-{:016x}{:016x}", fnv1a(name.as_bytes()), fnv1a(b"password")),
        }),
        ..spec(name)
    }
}

/// A UUID-shaped UID (version 4 layout) derived from `name`.
pub fn uid(name: &str) -> String {
    let high = fnv1a(name.as_bytes());
    let low = fnv1a(&[name.as_bytes(), b"/uid"].concat());
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xfff,
        (low >> 48) & 0xfff,
        low & 0xffff_ffff_ffff
    )
}

/// FNV-1a, 64 bits: stable across runs and Rust versions, unlike std's
/// hasher; these UIDs need nothing stronger.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_stable_distinct_and_uuid_shaped() {
        assert_eq!(uid("web-1"), uid("web-1"));
        assert_ne!(uid("web-1"), uid("web-2"));
        let uid = uid("web-1");
        let groups: Vec<usize> = uid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{uid}");
        assert!(uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[test]
    fn a_spec_with_auth_differs_only_in_the_credential() {
        let plain = spec("web-1");
        let with_auth = spec_with_auth("web-1");
        assert_eq!(ProxySpec { proxy_auth: None, ..with_auth.clone() }, plain);
        let auth = with_auth.proxy_auth.expect("a credential");
        assert!(auth.password.len() >= 32, "long enough not to turn up by chance");
    }
}

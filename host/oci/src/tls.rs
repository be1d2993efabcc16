//! The TLS crypto the registry client uses.
//!
//! The registry client's HTTP stack is built without a crypto provider of
//! its own (its default would compile aws-lc, which nothing else here
//! needs) and takes rustls's process-wide one; this installs ring, which
//! the rest of the host uses, unless the process installed one already.

/// Makes ring rustls's process-wide provider if none is installed.
pub(crate) fn install_default_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer leaves that one in place,
        // which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

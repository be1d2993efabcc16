//! Signing keys in cosign's files: an ECDSA P-256 public key as PEM
//! (`cosign.pub`), and its private key as cosign's encrypted PEM
//! (`cosign.key`: the PKCS#8 key sealed with NaCl secretbox under a key
//! derived from a password by scrypt), as `cosign generate-key-pair`
//! writes them and `cosign sign --key` reads them.
//!
//! The crypto is RustCrypto's (`p256`, `scrypt`, `crypto_secretbox`); this
//! file holds only cosign's framing of it. The `sigstore` crate implements
//! the same formats, but only over aws-lc or OpenSSL, which the host keeps
//! out (its TLS runs on ring).

use std::path::{Path, PathBuf};

use crypto_secretbox::aead::{Aead as _, KeyInit as _};
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePrivateKey as _};
use p256::pkcs8::{EncodePublicKey as _, LineEnding};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use zeroize::Zeroizing;

/// The largest key file read: a P-256 key is a few hundred bytes.
const MAX_KEY_FILE_BYTES: u64 = 64 << 10;
/// What cosign calls its encrypted private keys (older releases: COSIGN).
const PRIVATE_KEY_LABELS: &[&str] =
    &["ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY"];
/// cosign's scrypt cost (N = 2^15, r = 8, p = 1); keys written with
/// N = 2^16 are read too.
const SCRYPT_LOG_N: u8 = 15;
const SCRYPT_LOG_N_ACCEPTED: &[u8] = &[15, 16];
const SCRYPT_R: u32 = 8;
const SCRYPT_P: u32 = 1;
const SALT_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;

/// A key file that cannot be used, with why.
#[derive(Debug, Error)]
pub enum KeyError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a key of the kind expected.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// The password does not open the private key.
    #[error(
        "{}: the password does not decrypt this key (set COSIGN_PASSWORD or --key-password-file \
         to the password it was written with)",
        path.display()
    )]
    Password {
        /// The file.
        path: PathBuf,
    },
    /// No random bytes could be had for a new key.
    #[error("no randomness for a new key: {0}")]
    Random(String),
}

/// A public key that verifies signatures.
#[derive(Debug, Clone)]
pub struct PublicKey {
    key: VerifyingKey,
}

impl PublicKey {
    /// Reads an ECDSA P-256 public key from a PEM file (`PUBLIC KEY`), as
    /// `cosign generate-key-pair` writes `cosign.pub`.
    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let text = read_bounded(path)?;
        let key =
            VerifyingKey::from_public_key_pem(text.trim()).map_err(|err| KeyError::Invalid {
                path: path.to_owned(),
                reason: format!(
                    "not an ECDSA P-256 public key in PEM (`-----BEGIN PUBLIC KEY-----`, as \
                 cosign.pub): {err}"
                ),
            })?;
        Ok(Self { key })
    }

    /// True when `signature` (ASN.1 DER, as cosign writes it) signs
    /// `message` under this key.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        DerSignature::try_from(signature)
            .is_ok_and(|signature| self.key.verify(message, &signature).is_ok())
    }

    /// The key as PEM.
    pub fn to_pem(&self) -> String {
        self.key.to_public_key_pem(LineEnding::LF).unwrap_or_default()
    }

    /// `sha256:` and the digest of the key's DER encoding: how the key is
    /// named in logs and status without printing it whole.
    pub fn fingerprint(&self) -> String {
        let der = self.key.to_public_key_der().map(|der| der.as_bytes().to_vec());
        crate::digest::sha256(&der.unwrap_or_default())
    }
}

/// A private key that signs.
pub struct PrivateKey {
    key: SigningKey,
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateKey").field("public", &self.public().fingerprint()).finish()
    }
}

impl PrivateKey {
    /// A new random key.
    pub fn generate() -> Result<Self, KeyError> {
        loop {
            let mut bytes = Zeroizing::new([0u8; 32]);
            getrandom::fill(bytes.as_mut()).map_err(|err| KeyError::Random(err.to_string()))?;
            // Almost every 32 bytes are a valid scalar; the rest are drawn again.
            if let Ok(key) = SigningKey::from_slice(bytes.as_ref()) {
                return Ok(Self { key });
            }
        }
    }

    /// Reads cosign's encrypted private key from `path`, opened with
    /// `password`.
    pub fn read(path: &Path, password: &[u8]) -> Result<Self, KeyError> {
        let invalid = |reason: String| KeyError::Invalid { path: path.to_owned(), reason };
        let text = read_bounded(path)?;
        let (label, body) = pem_rfc7468::decode_vec(text.trim().as_bytes()).map_err(|err| {
            invalid(format!(
                "not a PEM file ({err}); expected cosign's `ENCRYPTED SIGSTORE PRIVATE KEY`"
            ))
        })?;
        if !PRIVATE_KEY_LABELS.contains(&label) {
            return Err(invalid(format!(
                "a PEM `{label}`; expected cosign's `ENCRYPTED SIGSTORE PRIVATE KEY` (from \
                 `proxyfleet plugin keygen` or `cosign generate-key-pair`)"
            )));
        }
        let sealed: Sealed = serde_json::from_slice(&body)
            .map_err(|err| invalid(format!("the sealed key is not cosign's JSON: {err}")))?;
        let plain = sealed.open(password).map_err(|why| match why {
            OpenError::Password => KeyError::Password { path: path.to_owned() },
            OpenError::Format(reason) => invalid(reason),
        })?;
        let key = SigningKey::from_pkcs8_der(&plain)
            .map_err(|err| invalid(format!("the key inside is not ECDSA P-256: {err}")))?;
        Ok(Self { key })
    }

    /// The key as cosign's encrypted PEM, sealed with `password`.
    pub fn to_encrypted_pem(&self, password: &[u8]) -> Result<String, KeyError> {
        let der = self
            .key
            .to_pkcs8_der()
            .map_err(|err| KeyError::Random(format!("cannot encode the key: {err}")))?;
        let sealed = Sealed::seal(der.as_bytes(), password)?;
        let json = serde_json::to_vec(&sealed).unwrap_or_default();
        pem_rfc7468::encode_string(PRIVATE_KEY_LABELS[0], pem_rfc7468::LineEnding::LF, &json)
            .map_err(|err| KeyError::Random(format!("cannot encode the key: {err}")))
    }

    /// Its public key.
    pub fn public(&self) -> PublicKey {
        PublicKey { key: *self.key.verifying_key() }
    }

    /// Signs `message`: ECDSA P-256 over its SHA-256, ASN.1 DER, as cosign
    /// signs.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let signature: DerSignature = self.key.sign(message);
        signature.as_bytes().to_vec()
    }
}

fn read_bounded(path: &Path) -> Result<String, KeyError> {
    use std::io::Read as _;
    let read = |source| KeyError::Read { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE_BYTES + 1).read_to_string(&mut text).map_err(read)?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(KeyError::Invalid {
            path: path.to_owned(),
            reason: format!("larger than {MAX_KEY_FILE_BYTES} bytes: not a key file"),
        });
    }
    Ok(text)
}

/// cosign's sealed private key: `{kdf, cipher, ciphertext}`.
#[derive(Serialize, Deserialize)]
struct Sealed {
    kdf: Kdf,
    cipher: Cipher,
    #[serde(with = "crate::base64_bytes")]
    ciphertext: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    #[serde(with = "crate::base64_bytes")]
    salt: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct ScryptParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    #[serde(with = "crate::base64_bytes")]
    nonce: Vec<u8>,
}

enum OpenError {
    Password,
    Format(String),
}

impl Sealed {
    fn seal(plain: &[u8], password: &[u8]) -> Result<Self, KeyError> {
        let mut salt = vec![0u8; SALT_BYTES];
        let mut nonce = vec![0u8; NONCE_BYTES];
        for bytes in [&mut salt, &mut nonce] {
            getrandom::fill(bytes).map_err(|err| KeyError::Random(err.to_string()))?;
        }
        let key = derive(password, &salt, SCRYPT_LOG_N)
            .map_err(|err| KeyError::Random(format!("scrypt: {err}")))?;
        let ciphertext = secretbox(&key)
            .encrypt(&nonce_of(&nonce).unwrap_or_default(), plain)
            .map_err(|err| KeyError::Random(format!("secretbox: {err}")))?;
        Ok(Self {
            kdf: Kdf {
                name: "scrypt".to_owned(),
                params: ScryptParams { n: 1 << SCRYPT_LOG_N, r: SCRYPT_R, p: SCRYPT_P },
                salt,
            },
            cipher: Cipher { name: "nacl/secretbox".to_owned(), nonce },
            ciphertext,
        })
    }

    fn open(&self, password: &[u8]) -> Result<Zeroizing<Vec<u8>>, OpenError> {
        let format = |reason: &str| OpenError::Format(reason.to_owned());
        if self.kdf.name != "scrypt" || self.cipher.name != "nacl/secretbox" {
            return Err(format("sealed with something other than scrypt and nacl/secretbox"));
        }
        let log_n = SCRYPT_LOG_N_ACCEPTED
            .iter()
            .copied()
            .find(|log_n| self.kdf.params.n == 1 << log_n)
            .filter(|_| self.kdf.params.r == SCRYPT_R && self.kdf.params.p == SCRYPT_P)
            .ok_or_else(|| {
                format("scrypt parameters other than cosign's (N 2^15 or 2^16, r 8, p 1)")
            })?;
        let nonce = nonce_of(&self.cipher.nonce)
            .ok_or_else(|| format("the secretbox nonce is not 24 bytes"))?;
        let key = derive(password, &self.kdf.salt, log_n).map_err(OpenError::Format)?;
        secretbox(&key)
            .decrypt(&nonce, self.ciphertext.as_slice())
            .map(Zeroizing::new)
            .map_err(|_| OpenError::Password)
    }
}

fn secretbox(key: &[u8; 32]) -> crypto_secretbox::XSalsa20Poly1305 {
    crypto_secretbox::XSalsa20Poly1305::new(&crypto_secretbox::Key::from(*key))
}

fn nonce_of(bytes: &[u8]) -> Option<crypto_secretbox::Nonce> {
    <[u8; NONCE_BYTES]>::try_from(bytes).ok().map(crypto_secretbox::Nonce::from)
}

fn derive(password: &[u8], salt: &[u8], log_n: u8) -> Result<Zeroizing<[u8; 32]>, String> {
    let params =
        scrypt::Params::new(log_n, SCRYPT_R, SCRYPT_P).map_err(|err| format!("scrypt: {err}"))?;
    let mut key = Zeroizing::new([0u8; 32]);
    scrypt::scrypt(password, salt, &params, key.as_mut())
        .map_err(|err| format!("scrypt: {err}"))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_written_and_read_back_signs_what_its_public_key_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let key = PrivateKey::generate().unwrap();
        let pem = key.to_encrypted_pem(b"secret words").unwrap();
        assert!(pem.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"), "{pem}");
        std::fs::write(dir.path().join("cosign.key"), &pem).unwrap();
        std::fs::write(dir.path().join("cosign.pub"), key.public().to_pem()).unwrap();
        let read = PrivateKey::read(&dir.path().join("cosign.key"), b"secret words").unwrap();
        let public = PublicKey::read(&dir.path().join("cosign.pub")).unwrap();
        let signature = read.sign(b"payload");
        assert!(public.verifies(b"payload", &signature));
        assert!(!public.verifies(b"another payload", &signature));
        assert!(!public.verifies(b"payload", b"not a signature"));
        assert_eq!(public.fingerprint(), key.public().fingerprint());
    }

    #[test]
    fn a_wrong_password_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cosign.key");
        let key = PrivateKey::generate().unwrap();
        std::fs::write(&path, key.to_encrypted_pem(b"right").unwrap()).unwrap();
        let err = PrivateKey::read(&path, b"wrong").unwrap_err();
        assert!(matches!(err, KeyError::Password { .. }), "{err}");
        assert!(err.to_string().contains("COSIGN_PASSWORD"), "{err}");
    }

    #[test]
    fn files_that_are_no_keys_are_refused_with_what_was_expected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cosign.pub");
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            .unwrap();
        let err = PublicKey::read(&path).unwrap_err().to_string();
        assert!(err.contains("ECDSA P-256 public key"), "{err}");
        let err = PrivateKey::read(&path, b"").unwrap_err().to_string();
        assert!(err.contains("ENCRYPTED SIGSTORE PRIVATE KEY"), "{err}");
        let missing = PublicKey::read(&dir.path().join("gone.pub")).unwrap_err();
        assert!(matches!(missing, KeyError::Read { .. }), "{missing}");
        std::fs::write(&path, vec![b'A'; 70 << 10]).unwrap();
        let err = PublicKey::read(&path).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }

    /// A key as `cosign generate-key-pair` writes it (scrypt N = 2^16), with
    /// an empty password: it opens, and what it signs verifies under its
    /// public key; any other password is refused as wrong.
    #[test]
    fn reads_a_key_written_by_cosign() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cosign.key");
        std::fs::write(&path, COSIGN_KEY).unwrap();
        let key = PrivateKey::read(&path, b"").unwrap();
        assert!(key.public().verifies(b"payload", &key.sign(b"payload")));
        let err = PrivateKey::read(&path, b"guess").unwrap_err();
        assert!(matches!(err, KeyError::Password { .. }), "{err}");
    }

    /// Written by cosign 2 (`COSIGN_PASSWORD= cosign generate-key-pair`).
    const COSIGN_KEY: &str = "\
-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n\
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjo2NTUzNiwiciI6\n\
OCwicCI6MX0sInNhbHQiOiJFY3pJR3Z0bnpFcCsxaEpudERnbGI1UnoxN3gwQVMy\n\
YklvWGRNcDQrU1NJPSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94\n\
Iiwibm9uY2UiOiJtSVVKbG1OMzNINExvZ0dhaG5MamdmK3R4SmJwci93MCJ9LCJj\n\
aXBoZXJ0ZXh0IjoiM3FtS2FidXRuYm1WT1IvTkZGM2NDaUErTXp1WWQ5L0VERDVI\n\
MVlUSGhQVzZsSzAvdjVqdDZCQzlsME12NGV5am9qZkl0d3B6a2JJOXQrZGx5VXZ3\n\
VUgvMWZjbkFZT2dEdXRLQzkvSkNiOE02SVY2VHpVaDF5c0ZFWDFzeG9xb1FzeUpL\n\
bjM0UVlldFNlaVdDaGtmUHUyZXByQjFEV0pwekdzTGZIakxNVTkzOEdmNk1xM1A0\n\
N0ZSd2syZzY1cFZnSGMwVWV1L1N1OUs0Zmc9PSJ9\n\
-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n\
";
}

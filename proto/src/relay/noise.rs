//! Noise per stream: `Noise_IK_25519_ChaChaPoly_BLAKE2s` (the default, and the reference's), or
//! `Noise_IK_25519_AESGCM_SHA256` where both ends have AES instructions ([`Cipher`]), through
//! snow's pure-Rust resolver.
//!
//! - The harness picks the cipher and names it in its handshake frame (`RelayHandshake.cipher`);
//!   the protocol name is the first thing both sides hash, so a relay that changes the field makes
//!   the handshake fail instead of downgrading it. The environment answers a cipher it does not
//!   accept with a reset starting [`CIPHER_REFUSED`].
//!
//! - The environment (responder) has a static keypair; its public half is registered with the
//!   registry, which hands it to harnesses.
//! - The harness (initiator) opens each stream with message 1; the environment answers with
//!   message 2; both switch to transport keys. The prologue binds the environment id and the
//!   stream id, so a handshake replayed onto another stream or environment fails.
//! - Transport messages use explicit nonces (snow's stateless transport): nonce = segment seq, so
//!   retransmitted and reordered segments decrypt, and a segment moved to another seq does not.
//! - Keys are never formatted: [`StaticKeypair`]'s `Debug` prints only the public key.

use snow::{Builder, HandshakeState, StatelessTransportState};

use super::limits::{MAX_HANDSHAKE_BYTES, MAX_SEGMENT_PAYLOAD_BYTES, NOISE_TAG_BYTES};
use super::reliability::{CipherError, SegmentCipher};

pub use super::cipher::{Cipher, NOISE_PARAMS, NOISE_PARAMS_AESGCM};

/// Start of the reset reason an environment gives for a handshake in a cipher it does not
/// accept: a harness that chose the cipher itself ([`CipherChoice::Auto`]) retries with
/// [`Cipher::ChaChaPoly`].
pub const CIPHER_REFUSED: &str = "cipher not accepted by this environment";

/// Which cipher a harness opens its streams with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CipherChoice {
    /// [`Cipher::preferred`], falling back to [`Cipher::ChaChaPoly`] when the environment
    /// refuses it ([`CIPHER_REFUSED`]).
    #[default]
    Auto,
    /// Only this cipher: a refusal fails the connection.
    Only(Cipher),
}

/// Which ciphers an environment accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CipherPolicy {
    /// ChaCha20-Poly1305 always; AES-GCM when this CPU has AES instructions (a harness that
    /// prefers it then falls back).
    #[default]
    Auto,
    /// Only this cipher.
    Only(Cipher),
    /// Both, whatever the CPU.
    Any,
}

impl CipherPolicy {
    /// Whether a handshake in `cipher` is accepted.
    pub fn accepts(self, cipher: Cipher) -> bool {
        match self {
            CipherPolicy::Auto => cipher.hardware_accelerated(),
            CipherPolicy::Only(only) => only == cipher,
            CipherPolicy::Any => true,
        }
    }

    /// The ciphers accepted, for messages.
    pub fn accepted(self) -> Vec<Cipher> {
        Cipher::ALL
            .into_iter()
            .filter(|c| self.accepts(*c))
            .collect()
    }
}

impl std::str::FromStr for CipherPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(CipherPolicy::Auto),
            "any" => Ok(CipherPolicy::Any),
            other => other.parse().map(CipherPolicy::Only).map_err(|_| {
                format!("unknown relay cipher policy {other:?} (auto, any, chachapoly or aesgcm)")
            }),
        }
    }
}
/// Length of an X25519 public key.
pub const PUBLIC_KEY_BYTES: usize = 32;

/// Why a handshake failed (never carries key material).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoiseError {
    /// snow refused to build a state (bad key length, ...).
    #[error("cannot set up Noise: {0}")]
    Setup(String),
    /// A handshake message was malformed or failed authentication.
    #[error("Noise handshake failed: {0}")]
    Handshake(String),
    /// The handshake names a cipher this end does not accept (the text starts with
    /// [`CIPHER_REFUSED`]).
    #[error("{0}")]
    CipherRefused(String),
    /// The peer's public key has the wrong length.
    #[error("public key must be {PUBLIC_KEY_BYTES} bytes (got {0})")]
    PublicKeyLength(usize),
}

fn setup(error: snow::Error) -> NoiseError {
    NoiseError::Setup(error.to_string())
}

fn builder(cipher: Cipher) -> Result<Builder<'static>, NoiseError> {
    let params = cipher.noise_params().parse().map_err(setup)?;
    Ok(Builder::new(params))
}

/// An environment's static keypair.
pub struct StaticKeypair {
    private: Vec<u8>,
    public: Vec<u8>,
}

impl std::fmt::Debug for StaticKeypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticKeypair")
            .field("public", &hex(&self.public))
            .field("private", &"<redacted>")
            .finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl StaticKeypair {
    /// A fresh random keypair.
    ///
    /// # Errors
    /// [`NoiseError::Setup`] when the system random source fails.
    pub fn generate() -> Result<Self, NoiseError> {
        let keypair = builder(Cipher::ChaChaPoly)?
            .generate_keypair()
            .map_err(setup)?;
        Ok(Self {
            private: keypair.private,
            public: keypair.public,
        })
    }

    /// The public key (safe to log and register).
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The private key, to persist it (an identity file); never log it.
    pub fn private_for_storage(&self) -> &[u8] {
        &self.private
    }

    /// A keypair read back from storage. The halves are checked against each other with a
    /// handshake of the keypair with itself, so a file whose public half was edited is caught.
    ///
    /// # Errors
    /// [`NoiseError::PublicKeyLength`] for a wrong length, [`NoiseError::Handshake`] when the
    /// halves do not belong together.
    pub fn from_stored(private: Vec<u8>, public: Vec<u8>) -> Result<Self, NoiseError> {
        if private.len() != PUBLIC_KEY_BYTES {
            return Err(NoiseError::PublicKeyLength(private.len()));
        }
        let keypair = Self { private, public };
        let cipher = Cipher::ChaChaPoly;
        let (_, message) = Initiator::start("self-check", "self-check", &keypair.public, cipher)?;
        respond(&keypair, "self-check", "self-check", &message, cipher).map_err(|_| {
            NoiseError::Handshake("the stored public key does not belong to the private key".into())
        })?;
        Ok(keypair)
    }
}

/// The prologue both sides mix in: binds the environment and the stream.
pub fn prologue(environment_id: &str, stream_id: &str) -> Vec<u8> {
    let mut prologue = b"execward relay v1\0".to_vec();
    prologue.extend_from_slice(environment_id.as_bytes());
    prologue.push(0);
    prologue.extend_from_slice(stream_id.as_bytes());
    prologue
}

/// The initiator after message 1.
pub struct Initiator {
    state: HandshakeState,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Initiator { .. }")
    }
}

impl Initiator {
    /// Start a handshake in `cipher` towards `environment_public`; returns the state and
    /// message 1.
    ///
    /// # Errors
    /// [`NoiseError`] for a bad public key or a random-source failure.
    pub fn start(
        environment_id: &str,
        stream_id: &str,
        environment_public: &[u8],
        cipher: Cipher,
    ) -> Result<(Self, Vec<u8>), NoiseError> {
        if environment_public.len() != PUBLIC_KEY_BYTES {
            return Err(NoiseError::PublicKeyLength(environment_public.len()));
        }
        // The harness's static key only completes the IK pattern: harnesses are authorised by
        // the registry's bearer token, not by key, so a fresh one per stream is enough.
        let own = StaticKeypair::generate()?;
        let prologue = prologue(environment_id, stream_id);
        let mut state = builder(cipher)?
            .local_private_key(&own.private)
            .and_then(|b| b.remote_public_key(environment_public))
            .and_then(|b| b.prologue(&prologue))
            .and_then(|b| b.build_initiator())
            .map_err(setup)?;
        let mut message = vec![0u8; MAX_HANDSHAKE_BYTES];
        let len = state
            .write_message(&[], &mut message)
            .map_err(|e| NoiseError::Handshake(e.to_string()))?;
        message.truncate(len);
        Ok((Self { state }, message))
    }

    /// Read message 2 and switch to transport keys.
    ///
    /// # Errors
    /// [`NoiseError::Handshake`] when message 2 does not authenticate.
    pub fn finish(mut self, message: &[u8]) -> Result<NoiseCipher, NoiseError> {
        let mut payload = vec![0u8; MAX_HANDSHAKE_BYTES];
        self.state
            .read_message(message, &mut payload)
            .map_err(|e| NoiseError::Handshake(e.to_string()))?;
        let transport = self
            .state
            .into_stateless_transport_mode()
            .map_err(|e| NoiseError::Handshake(e.to_string()))?;
        Ok(NoiseCipher(transport))
    }
}

/// Answer message 1 (made in `cipher`) as the environment: returns the transport keys and
/// message 2.
///
/// # Errors
/// [`NoiseError::Handshake`] when message 1 does not authenticate (wrong key, wrong prologue,
/// another cipher than the one named, corrupt bytes).
pub fn respond(
    keypair: &StaticKeypair,
    environment_id: &str,
    stream_id: &str,
    message: &[u8],
    cipher: Cipher,
) -> Result<(NoiseCipher, Vec<u8>), NoiseError> {
    let prologue = prologue(environment_id, stream_id);
    let mut state = builder(cipher)?
        .local_private_key(&keypair.private)
        .and_then(|b| b.prologue(&prologue))
        .and_then(|b| b.build_responder())
        .map_err(setup)?;
    let mut payload = vec![0u8; MAX_HANDSHAKE_BYTES];
    state
        .read_message(message, &mut payload)
        .map_err(|e| NoiseError::Handshake(e.to_string()))?;
    let mut reply = vec![0u8; MAX_HANDSHAKE_BYTES];
    let len = state
        .write_message(&[], &mut reply)
        .map_err(|e| NoiseError::Handshake(e.to_string()))?;
    reply.truncate(len);
    let transport = state
        .into_stateless_transport_mode()
        .map_err(|e| NoiseError::Handshake(e.to_string()))?;
    Ok((NoiseCipher(transport), reply))
}

/// Noise transport keys of one stream, used with nonce = seq.
pub struct NoiseCipher(StatelessTransportState);

impl std::fmt::Debug for NoiseCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoiseCipher { .. }")
    }
}

impl SegmentCipher for NoiseCipher {
    fn seal(&mut self, seq: u64, plaintext: &[u8]) -> Result<Vec<u8>, CipherError> {
        let mut out = vec![0u8; plaintext.len() + NOISE_TAG_BYTES];
        let len = self
            .0
            .write_message(seq, plaintext, &mut out)
            .map_err(|e| CipherError {
                seq,
                reason: e.to_string(),
            })?;
        out.truncate(len);
        Ok(out)
    }

    fn seal_append(
        &mut self,
        seq: u64,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CipherError> {
        let start = out.len();
        out.resize(start + plaintext.len() + NOISE_TAG_BYTES, 0);
        match self.0.write_message(seq, plaintext, &mut out[start..]) {
            Ok(len) => {
                out.truncate(start + len);
                Ok(())
            }
            Err(e) => {
                out.truncate(start);
                Err(CipherError {
                    seq,
                    reason: e.to_string(),
                })
            }
        }
    }

    fn open_into(
        &mut self,
        seq: u64,
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CipherError> {
        let fail = |reason: String| CipherError { seq, reason };
        if ciphertext.len() < NOISE_TAG_BYTES || ciphertext.len() > MAX_SEGMENT_PAYLOAD_BYTES {
            return Err(fail(format!("ciphertext of {} bytes", ciphertext.len())));
        }
        if out.len() < ciphertext.len() - NOISE_TAG_BYTES {
            return Err(fail(format!(
                "plaintext of {} bytes does not fit a {}-byte buffer",
                ciphertext.len() - NOISE_TAG_BYTES,
                out.len()
            )));
        }
        self.0
            .read_message(seq, ciphertext, out)
            .map_err(|e| fail(e.to_string()))
    }

    fn open(&mut self, seq: u64, ciphertext: &[u8]) -> Result<Vec<u8>, CipherError> {
        let fail = |reason: String| CipherError { seq, reason };
        if ciphertext.len() < NOISE_TAG_BYTES || ciphertext.len() > MAX_SEGMENT_PAYLOAD_BYTES {
            return Err(fail(format!("ciphertext of {} bytes", ciphertext.len())));
        }
        let mut out = vec![0u8; ciphertext.len()];
        let len = self
            .0
            .read_message(seq, ciphertext, &mut out)
            .map_err(|e| fail(e.to_string()))?;
        out.truncate(len);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(env: &str, stream: &str) -> (NoiseCipher, NoiseCipher) {
        pair_in(env, stream, Cipher::ChaChaPoly)
    }

    fn pair_in(env: &str, stream: &str, cipher: Cipher) -> (NoiseCipher, NoiseCipher) {
        let keys = StaticKeypair::generate().unwrap();
        let (initiator, m1) = Initiator::start(env, stream, keys.public(), cipher).unwrap();
        let (responder, m2) = respond(&keys, env, stream, &m1, cipher).unwrap();
        (initiator.finish(&m2).unwrap(), responder)
    }

    #[test]
    fn both_ciphers_carry_segments_and_a_handshake_in_the_other_cipher_fails() {
        for cipher in Cipher::ALL {
            let (mut harness, mut environment) = pair_in("env", "s1", cipher);
            let sealed = harness.seal(3, b"segment").unwrap();
            assert_eq!(
                environment.open(3, &sealed).unwrap(),
                b"segment",
                "{cipher}"
            );
            let back = environment.seal(0, b"reply").unwrap();
            assert_eq!(harness.open(0, &back).unwrap(), b"reply", "{cipher}");
            assert_eq!(Cipher::from_wire(cipher.wire()), Some(cipher));
            assert_eq!(cipher.name().parse::<Cipher>(), Ok(cipher));
        }
        // The ciphertexts differ: the cipher is really switched, not only named.
        let keys = StaticKeypair::generate().unwrap();
        let (_, chacha) = Initiator::start("env", "s1", keys.public(), Cipher::ChaChaPoly).unwrap();
        let (_, aes) = Initiator::start("env", "s1", keys.public(), Cipher::AesGcm).unwrap();
        // Message 1 read as the other cipher (a relay that rewrote the field) fails.
        assert!(respond(&keys, "env", "s1", &chacha, Cipher::AesGcm).is_err());
        assert!(respond(&keys, "env", "s1", &aes, Cipher::ChaChaPoly).is_err());
        assert!(respond(&keys, "env", "s1", &aes, Cipher::AesGcm).is_ok());
        assert_eq!(Cipher::from_wire(2), None);
    }

    #[test]
    fn a_cipher_policy_accepts_what_it_names() {
        assert!(CipherPolicy::Any.accepts(Cipher::AesGcm));
        assert!(CipherPolicy::Auto.accepts(Cipher::ChaChaPoly));
        assert_eq!(
            CipherPolicy::Auto.accepts(Cipher::AesGcm),
            Cipher::AesGcm.hardware_accelerated()
        );
        let only = "chachapoly".parse::<CipherPolicy>().unwrap();
        assert_eq!(only.accepted(), vec![Cipher::ChaChaPoly]);
        assert!("rot13".parse::<CipherPolicy>().is_err());
    }

    #[test]
    fn segments_round_trip_with_seq_as_nonce_in_any_order() {
        let (mut harness, mut environment) = pair("env", "s1");
        let sealed: Vec<_> = (0..4)
            .map(|seq| {
                harness
                    .seal(seq, format!("segment {seq}").as_bytes())
                    .unwrap()
            })
            .collect();
        for seq in [3, 0, 2, 1, 3] {
            let plain = environment.open(seq, &sealed[seq as usize]).unwrap();
            assert_eq!(plain, format!("segment {seq}").as_bytes());
        }
        // Moved to another seq, a segment does not authenticate.
        assert!(environment.open(1, &sealed[0]).is_err());
        // The other direction has its own keys.
        let back = environment.seal(0, b"reply").unwrap();
        assert_eq!(harness.open(0, &back).unwrap(), b"reply");
        assert!(environment.open(0, &back).is_err());
    }

    #[test]
    fn sealing_in_place_matches_seal_and_opening_in_place_checks_the_tag_and_the_room() {
        let (mut harness, mut environment) = pair("env", "s1");
        let mut out = b"prefix".to_vec();
        harness.seal_append(7, b"ack record", &mut out).unwrap();
        assert_eq!(&out[..6], b"prefix");
        let sealed = out[6..].to_vec();
        assert_eq!(sealed.len(), b"ack record".len() + NOISE_TAG_BYTES);
        // The same bytes as the allocating form, which the peer opens either way.
        assert_eq!(environment.open(7, &sealed).unwrap(), b"ack record");
        let mut record = [0u8; 10];
        assert_eq!(environment.open_into(7, &sealed, &mut record).unwrap(), 10);
        assert_eq!(&record, b"ack record");
        // Too little room, another nonce, or one flipped bit: refused.
        assert!(environment.open_into(7, &sealed, &mut [0u8; 9]).is_err());
        assert!(environment.open_into(8, &sealed, &mut record).is_err());
        let mut tampered = sealed.clone();
        tampered[0] ^= 1;
        assert!(environment.open_into(7, &tampered, &mut record).is_err());
        assert!(environment.open_into(7, &sealed[..8], &mut record).is_err());
    }

    #[test]
    fn a_handshake_for_another_stream_or_key_fails() {
        let keys = StaticKeypair::generate().unwrap();
        let cipher = Cipher::ChaChaPoly;
        let (_, m1) = Initiator::start("env", "s1", keys.public(), cipher).unwrap();
        assert!(respond(&keys, "env", "s2", &m1, cipher).is_err());
        assert!(respond(&keys, "other-env", "s1", &m1, cipher).is_err());
        let stranger = StaticKeypair::generate().unwrap();
        assert!(respond(&stranger, "env", "s1", &m1, cipher).is_err());
    }

    #[test]
    fn a_stored_keypair_is_checked_for_consistency() {
        let keys = StaticKeypair::generate().unwrap();
        let back =
            StaticKeypair::from_stored(keys.private_for_storage().to_vec(), keys.public().to_vec())
                .unwrap();
        assert_eq!(back.public(), keys.public());
        let other = StaticKeypair::generate().unwrap();
        assert!(
            StaticKeypair::from_stored(
                keys.private_for_storage().to_vec(),
                other.public().to_vec()
            )
            .is_err()
        );
        assert!(StaticKeypair::from_stored(vec![1; 31], keys.public().to_vec()).is_err());
    }

    #[test]
    fn debug_output_never_shows_the_private_key() {
        let keys = StaticKeypair::generate().unwrap();
        let shown = format!("{keys:?}");
        assert!(shown.contains("<redacted>"));
        assert!(!shown.contains(&hex(&keys.private)));
    }
}

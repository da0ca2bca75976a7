//! The AEAD ciphers a relay stream's Noise channel may use, and their names on the wire and in
//! configuration (a leaf module: the frame layer names a handshake's cipher, the Noise layer
//! builds it).

/// The Noise protocol name of the default cipher ([`Cipher::ChaChaPoly`]).
pub const NOISE_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
/// The Noise protocol name of [`Cipher::AesGcm`].
pub const NOISE_PARAMS_AESGCM: &str = "Noise_IK_25519_AESGCM_SHA256";
/// The AEAD cipher of a stream's Noise channel (`RelayHandshake.cipher` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cipher {
    /// ChaCha20-Poly1305 with BLAKE2s (wire value 0, the field's default): fast everywhere.
    ChaChaPoly,
    /// AES-256-GCM with SHA-256 (wire value 1): faster where the CPU has AES and carry-less
    /// multiply instructions, much slower where it has not.
    AesGcm,
}

impl Cipher {
    /// Every cipher, default first.
    pub const ALL: [Cipher; 2] = [Cipher::ChaChaPoly, Cipher::AesGcm];

    /// The Noise protocol name.
    pub fn noise_params(self) -> &'static str {
        match self {
            Cipher::ChaChaPoly => NOISE_PARAMS,
            Cipher::AesGcm => NOISE_PARAMS_AESGCM,
        }
    }

    /// The value of `RelayHandshake.cipher`.
    pub fn wire(self) -> u32 {
        match self {
            Cipher::ChaChaPoly => 0,
            Cipher::AesGcm => 1,
        }
    }

    /// The cipher a `RelayHandshake.cipher` value names, if any.
    pub fn from_wire(value: u32) -> Option<Cipher> {
        match value {
            0 => Some(Cipher::ChaChaPoly),
            1 => Some(Cipher::AesGcm),
            _ => None,
        }
    }

    /// The short name (`chachapoly`, `aesgcm`), as configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::ChaChaPoly => "chachapoly",
            Cipher::AesGcm => "aesgcm",
        }
    }

    /// Whether this CPU runs the cipher in hardware (AES-GCM: AES and carry-less multiply
    /// instructions, which the `aes` and `polyval` crates detect and use at run time).
    pub fn hardware_accelerated(self) -> bool {
        match self {
            Cipher::ChaChaPoly => true,
            Cipher::AesGcm => aes_instructions(),
        }
    }

    /// The cipher a harness opens with unless told otherwise: ChaCha20-Poly1305. Measured in
    /// one `bench --only remote` run on an AMD EPYC with AES-NI and PCLMULQDQ, snow's AES-GCM
    /// carried 192 MiB/s of output against ChaCha20-Poly1305's 331 MiB/s (1.7x slower), so
    /// AES-GCM is offered (`CipherChoice::Only`), not preferred, until it measures faster.
    pub fn preferred() -> Cipher {
        Cipher::ChaChaPoly
    }
}

impl std::fmt::Display for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Cipher {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Cipher::ALL
            .into_iter()
            .find(|c| c.name() == text)
            .ok_or_else(|| format!("unknown relay cipher {text:?} (chachapoly or aesgcm)"))
    }
}

#[cfg(target_arch = "x86_64")]
fn aes_instructions() -> bool {
    std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "aarch64")]
fn aes_instructions() -> bool {
    std::arch::is_aarch64_feature_detected!("aes")
        && std::arch::is_aarch64_feature_detected!("pmull")
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn aes_instructions() -> bool {
    false
}

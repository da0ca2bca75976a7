//! Who may open a websocket on the server's listener.
//!
//! A connection is admitted when it presents the bearer token (`--auth-token-file`), or, without
//! one, when the kernel names the owner of the peer's socket as the server's own user or root:
//! `SO_PEERCRED` on the unix socket (beside its 0600 mode), the socket table (`sock_diag`) on
//! loopback TCP, where every user of the host can connect. Root is admitted because it can read
//! any token file and trace the server anyway: refusing it would protect nothing. Everyone
//! else (another local user, a peer on the network, a loopback peer whose owner the kernel
//! cannot name) must present the token, and a server without one admits nobody else. Failing to
//! learn the owner (no `NETLINK_SOCK_DIAG` on this host, a socket closed before it was looked
//! up) fails closed: the token is required.
//!
//! A wrong token is refused even from the server's own user (`http::read_head`), so a
//! misconfigured client learns of it.

use super::identity::ClientIdentity;

/// Who may connect: the token, and the user the server runs as.
#[derive(Debug)]
pub struct ListenerAccess {
    token: Option<Vec<u8>>,
    server_uid: u32,
}

/// Why a connection without a token was refused; the HTTP answer and the log line name it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The peer's socket belongs to another user.
    #[error(
        "the connecting socket belongs to uid {uid}; without a bearer token this server admits \
         only its own user (uid {server_uid}) and root{}",
        token_hint(*.token_configured)
    )]
    OtherUser {
        /// The owner of the peer's socket.
        uid: u32,
        /// The server's uid.
        server_uid: u32,
        /// Whether a token would have admitted it.
        token_configured: bool,
    },
    /// The peer is of the server's own user but runs in another user namespace (a sandbox of
    /// another server, a container), or its process cannot be examined.
    #[error(
        "the connecting process runs as uid {uid} in another user namespace than this server's \
         (a sandbox or a container), where a uid vouches for nothing; without a bearer token \
         this server admits only its own user and root from its own user namespace{}",
        token_hint(*.token_configured)
    )]
    OtherNamespace {
        /// The owner of the peer's socket.
        uid: u32,
        /// Whether a token would have admitted it.
        token_configured: bool,
    },
    /// The owner of the peer's socket cannot be established (a peer on the network, or a
    /// loopback peer the kernel's socket table does not name).
    #[error(
        "the owner of the connecting socket ({peer}) cannot be established; without a bearer \
         token this server admits only its own user (uid {server_uid}) and root{}",
        token_hint(*.token_configured)
    )]
    OwnerUnknown {
        /// What is known of the peer.
        peer: ClientIdentity,
        /// The server's uid.
        server_uid: u32,
        /// Whether a token would have admitted it.
        token_configured: bool,
    },
}

fn token_hint(token_configured: bool) -> &'static str {
    if token_configured {
        ": send Authorization: Bearer <token>"
    } else {
        " (the server has no --auth-token-file, so no token can admit another user)"
    }
}

impl Refusal {
    /// The reason's label in `GET /metrics` (`execward_listener_refusals_total`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::OtherUser { .. } => "otherUser",
            Self::OwnerUnknown { .. } => "ownerUnknown",
            Self::OtherNamespace { .. } => "otherNamespace",
        }
    }

    /// The HTTP status: 401 when the token would admit the peer, 403 when nothing would.
    pub fn status(&self) -> &'static str {
        let (Self::OtherUser {
            token_configured, ..
        }
        | Self::OwnerUnknown {
            token_configured, ..
        }
        | Self::OtherNamespace {
            token_configured, ..
        }) = self;
        if *token_configured {
            "401 Unauthorized"
        } else {
            "403 Forbidden"
        }
    }

    /// The plain-text body of the refusal.
    pub fn body(&self) -> String {
        format!("refused: {self}\n")
    }
}

impl ListenerAccess {
    /// Access for a server running as the current effective uid, with `token` if configured.
    pub fn for_current_user(token: Option<Vec<u8>>) -> Self {
        Self {
            token,
            server_uid: nix::unistd::geteuid().as_raw(),
        }
    }

    /// The bearer token, when one is configured.
    pub fn token(&self) -> Option<&[u8]> {
        self.token.as_deref()
    }

    /// Judge a peer that presented no token, by what the kernel says of it.
    ///
    /// # Errors
    /// [`Refusal`] naming the peer's owner (or that it is unknown).
    pub fn admit_without_token(&self, peer: ClientIdentity) -> Result<(), Refusal> {
        let token_configured = self.token.is_some();
        match peer {
            ClientIdentity::Uid(uid) if uid == self.server_uid || uid == 0 => Ok(()),
            ClientIdentity::Uid(uid) => Err(Refusal::OtherUser {
                uid,
                server_uid: self.server_uid,
                token_configured,
            }),
            ClientIdentity::Confined(uid) => Err(Refusal::OtherNamespace {
                uid,
                token_configured,
            }),
            ClientIdentity::Address(_) | ClientIdentity::Relay(_) => Err(Refusal::OwnerUnknown {
                peer,
                server_uid: self.server_uid,
                token_configured,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::transport::admission::Source;

    fn access(token: bool, server_uid: u32) -> ListenerAccess {
        ListenerAccess {
            token: token.then(|| b"t".to_vec()),
            server_uid,
        }
    }

    #[test]
    fn the_servers_own_user_and_root_need_no_token() {
        for token in [false, true] {
            let access = access(token, 1000);
            assert_eq!(
                access.admit_without_token(ClientIdentity::Uid(1000)),
                Ok(())
            );
            assert_eq!(access.admit_without_token(ClientIdentity::Uid(0)), Ok(()));
        }
    }

    #[test]
    fn another_user_is_refused_with_401_or_403_naming_its_uid() {
        let refusal = access(true, 0)
            .admit_without_token(ClientIdentity::Uid(65534))
            .unwrap_err();
        assert_eq!(refusal.status(), "401 Unauthorized");
        assert!(refusal.body().contains("uid 65534"), "{}", refusal.body());
        assert!(refusal.body().contains("Bearer"), "{}", refusal.body());
        let refusal = access(false, 0)
            .admit_without_token(ClientIdentity::Uid(65534))
            .unwrap_err();
        assert_eq!(refusal.status(), "403 Forbidden");
        assert!(refusal.body().contains("no --auth-token-file"));
    }

    #[test]
    fn an_unknown_owner_is_refused_fail_closed() {
        for peer in [
            ClientIdentity::Address(Source::Local),
            ClientIdentity::Address(Source::Ip("127.0.0.1".parse().unwrap())),
        ] {
            let refusal = access(true, 0).admit_without_token(peer).unwrap_err();
            assert!(
                matches!(refusal, Refusal::OwnerUnknown { .. }),
                "{refusal:?}"
            );
            assert!(refusal.body().contains("cannot be established"));
        }
    }

    #[test]
    fn the_servers_own_user_in_another_user_namespace_is_refused() {
        for token in [false, true] {
            let refusal = access(token, 1000)
                .admit_without_token(ClientIdentity::Confined(1000))
                .unwrap_err();
            assert_eq!(refusal.label(), "otherNamespace");
            assert!(
                refusal.body().contains("another user namespace"),
                "{}",
                refusal.body()
            );
        }
    }
}

//! Relay frames cut into NATS messages of at most [`MAX_PIECE_BYTES`], and put back together.
//!
//! Why: `nats-server` (2.9, the distribution's) copies a message that arrives split over two of
//! its 64 KiB reads into a fresh allocation, and queues a message over 64 KiB for its subscriber
//! in another one; a relay frame is up to 64 KiB of Noise segment. Measured with the bench's
//! cluster row, whole frames cost `nats-server` about 3.6 CPU-seconds per GiB, most of it page
//! faults and clearing of fresh memory; 16 KiB pieces stay in its reused buffers.
//!
//! A frame of at most [`MAX_PIECE_BYTES`] travels whole. A longer one travels as `count` pieces
//! of nearly equal size, each with a piece header: the frame's id (per publishing node, from a
//! counter starting at random), the piece's index and the count. NATS keeps one publisher's
//! messages on one subject in order, so a frame's pieces arrive one after the other unless one
//! was lost (a full publish queue, a NATS reconnect) or a second node published on the same
//! subject meanwhile (a takeover). Then the piece does not follow the one before it and the
//! frame in progress is dropped, as a frame lost on a single node is: the endpoints retransmit.
//! A frame is never delivered with a piece of another.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::relay::limits::MAX_RELAY_FRAME_BYTES;
use tokio_tungstenite::tungstenite::Bytes;

/// The longest relay frame sent as one NATS message, and the longest piece of a longer one.
pub const MAX_PIECE_BYTES: usize = 16 * 1024;
/// Bytes of a piece header: frame id (u64 BE), piece index (u16 BE), piece count (u16 BE).
pub const PIECE_HEADER_BYTES: usize = 12;
/// Frames of different sources (harness sockets) one [`ReassemblyBySource`] puts back together
/// at once. A node sends a frame's pieces back to back, so about as many are in progress as
/// nodes publish to one executor; a first piece beyond the bound drops the oldest frame in
/// progress (one whose remaining pieces were lost stays until then). So at most this many times
/// `MAX_RELAY_FRAME_BYTES` is held, and lost pieces never fill the table for good.
pub const MAX_FRAMES_IN_PIECES: usize = 64;
/// The most pieces a frame is cut into (a count above it is malformed).
pub const MAX_PIECES: usize = MAX_RELAY_FRAME_BYTES.div_ceil(MAX_PIECE_BYTES);

/// One piece of a frame, as read from a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The frame's id (unique per publishing node).
    pub id: u64,
    /// This piece's place, from 0.
    pub index: u16,
    /// How many pieces the frame has (at least 2).
    pub count: u16,
    /// The piece's bytes.
    pub bytes: Bytes,
}

impl Piece {
    /// Parse a piece header and the bytes after it; `None` when malformed.
    pub fn decode(message: &Bytes, at: usize) -> Option<Self> {
        let header = message.get(at..at + PIECE_HEADER_BYTES)?;
        let id = u64::from_be_bytes(header[..8].try_into().ok()?);
        let index = u16::from_be_bytes(header[8..10].try_into().ok()?);
        let count = u16::from_be_bytes(header[10..12].try_into().ok()?);
        let valid = (2..=MAX_PIECES).contains(&usize::from(count))
            && index < count
            && message.len() > at + PIECE_HEADER_BYTES;
        valid.then(|| Self {
            id,
            index,
            count,
            bytes: message.slice(at + PIECE_HEADER_BYTES..),
        })
    }
}

/// Frame ids of one node (cheap to clone).
#[derive(Clone, Debug)]
pub struct FrameIds(Arc<AtomicU64>);

impl FrameIds {
    /// Ids from a random start, so two nodes' ids do not run in step.
    pub fn new() -> Self {
        let (start, _) = uuid::Uuid::new_v4().as_u64_pair();
        Self(Arc::new(AtomicU64::new(start)))
    }

    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// The messages carrying `frame`: `whole` followed by the frame when it is at most
/// [`MAX_PIECE_BYTES`], else for each piece `piece`, a piece header and the piece.
pub fn cut(frame: &[u8], whole: &[u8], piece: &[u8], ids: &FrameIds) -> Vec<Bytes> {
    if frame.len() <= MAX_PIECE_BYTES {
        return vec![Bytes::from([whole, frame].concat())];
    }
    let count = frame.len().div_ceil(MAX_PIECE_BYTES);
    let size = frame.len().div_ceil(count);
    let id = ids.next();
    let count_bytes = u16::try_from(count).unwrap_or(u16::MAX).to_be_bytes();
    frame
        .chunks(size)
        .enumerate()
        .map(|(index, bytes)| {
            let index = u16::try_from(index).unwrap_or(u16::MAX).to_be_bytes();
            Bytes::from([piece, &id.to_be_bytes(), &index, &count_bytes, bytes].concat())
        })
        .collect()
}

/// One frame being put back together (at most [`MAX_RELAY_FRAME_BYTES`] held).
#[derive(Debug, Default)]
pub struct Reassembly {
    id: u64,
    next: u16,
    count: u16,
    bytes: Vec<u8>,
}

impl Reassembly {
    /// Take the next piece; the whole frame once its last piece is in. A piece that does not
    /// follow the one before it (lost pieces, another publisher between them) drops the frame
    /// in progress; a first piece starts a new one.
    pub fn push(&mut self, piece: &Piece) -> Option<Bytes> {
        if piece.index == 0 {
            self.clear();
            self.id = piece.id;
            self.count = piece.count;
            self.bytes
                .reserve((piece.bytes.len() * usize::from(piece.count)).min(MAX_RELAY_FRAME_BYTES));
        } else if self.count == 0
            || piece.id != self.id
            || piece.count != self.count
            || piece.index != self.next
        {
            self.clear();
            return None;
        }
        if self.bytes.len() + piece.bytes.len() > MAX_RELAY_FRAME_BYTES {
            self.clear();
            return None;
        }
        self.bytes.extend_from_slice(&piece.bytes);
        self.next += 1;
        if self.next < self.count {
            return None;
        }
        let frame = Bytes::from(std::mem::take(&mut self.bytes));
        self.clear();
        Some(frame)
    }

    /// Whether a frame is in progress.
    pub fn is_pending(&self) -> bool {
        self.count != 0
    }

    fn clear(&mut self) {
        self.next = 0;
        self.count = 0;
        self.bytes = Vec::new();
    }
}

/// Frames of many sources (harness sockets, by id) put back together, at most
/// [`MAX_FRAMES_IN_PIECES`] at once.
#[derive(Debug, Default)]
pub struct ReassemblyBySource {
    /// Each source's frame in progress, with the order it started in.
    frames: HashMap<u64, (u64, Reassembly)>,
    started: u64,
}

impl ReassemblyBySource {
    /// Take the next piece of `source`'s frame; the frame once whole. A first piece when
    /// [`MAX_FRAMES_IN_PIECES`] frames are in progress drops the one that started first.
    pub fn push(&mut self, source: u64, piece: &Piece) -> Option<Bytes> {
        if !self.frames.contains_key(&source) {
            if piece.index != 0 {
                return None;
            }
            if self.frames.len() >= MAX_FRAMES_IN_PIECES
                && let Some(oldest) = self
                    .frames
                    .iter()
                    .min_by_key(|(_, (started, _))| *started)
                    .map(|(oldest, _)| *oldest)
            {
                self.frames.remove(&oldest);
            }
        }
        self.started += 1;
        let started = self.started;
        let (_, reassembly) = self
            .frames
            .entry(source)
            .or_insert_with(|| (started, Reassembly::default()));
        let frame = reassembly.push(piece);
        if !reassembly.is_pending() {
            self.frames.remove(&source);
        }
        frame
    }

    /// `source` is gone: drop its frame in progress.
    pub fn forget(&mut self, source: u64) {
        self.frames.remove(&source);
    }

    /// Frames in progress.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces_of(messages: &[Bytes]) -> Vec<Piece> {
        messages
            .iter()
            .map(|message| {
                assert_eq!(message[0], b'p');
                Piece::decode(message, 1).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_frame_cut_into_pieces_comes_back_whole_and_short_frames_are_not_cut() {
        let ids = FrameIds::new();
        for len in [
            1,
            MAX_PIECE_BYTES,
            MAX_PIECE_BYTES + 1,
            3 * MAX_PIECE_BYTES - 1,
            MAX_RELAY_FRAME_BYTES,
        ] {
            let frame: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let messages = cut(&frame, b"w", b"p", &ids);
            if len <= MAX_PIECE_BYTES {
                assert_eq!(messages.len(), 1);
                assert_eq!(&messages[0][..], [b"w".as_slice(), &frame].concat());
                continue;
            }
            assert_eq!(messages.len(), len.div_ceil(MAX_PIECE_BYTES), "{len}");
            assert!(
                messages
                    .iter()
                    .all(|m| m.len() <= 1 + PIECE_HEADER_BYTES + MAX_PIECE_BYTES)
            );
            let mut reassembly = Reassembly::default();
            let pieces = pieces_of(&messages);
            let (last, first) = pieces.split_last().unwrap();
            for piece in first {
                assert_eq!(reassembly.push(piece), None);
                assert!(reassembly.is_pending());
            }
            assert_eq!(reassembly.push(last).as_deref(), Some(&frame[..]), "{len}");
            assert!(!reassembly.is_pending());
        }
    }

    #[test]
    fn a_lost_or_foreign_piece_drops_the_frame_and_never_splices_two() {
        let ids = FrameIds::new();
        let a = pieces_of(&cut(&[1; 3 * MAX_PIECE_BYTES], b"w", b"p", &ids));
        let b = pieces_of(&cut(&[2; 3 * MAX_PIECE_BYTES], b"w", b"p", &ids));
        let mut reassembly = Reassembly::default();
        // A lost middle piece: the last one does not follow.
        assert_eq!(reassembly.push(&a[0]), None);
        assert_eq!(reassembly.push(&a[2]), None);
        assert!(!reassembly.is_pending());
        // Another frame's piece between two of one frame.
        assert_eq!(reassembly.push(&a[0]), None);
        assert_eq!(reassembly.push(&b[1]), None);
        assert_eq!(reassembly.push(&a[1]), None);
        assert_eq!(reassembly.push(&a[2]), None);
        // A first piece abandons the frame in progress and starts over.
        assert_eq!(reassembly.push(&a[0]), None);
        assert_eq!(reassembly.push(&b[0]), None);
        assert_eq!(reassembly.push(&b[1]), None);
        assert_eq!(
            reassembly.push(&b[2]).as_deref(),
            Some(&[2; 3 * MAX_PIECE_BYTES][..])
        );
        // The same id from another node with another count is not its continuation.
        let mut forged = a[1].clone();
        forged.count = 4;
        assert_eq!(reassembly.push(&a[0]), None);
        assert_eq!(reassembly.push(&forged), None);
        assert!(!reassembly.is_pending());
    }

    #[test]
    fn malformed_piece_headers_are_refused() {
        let good = cut(&[0; 2 * MAX_PIECE_BYTES], b"", b"", &FrameIds::new());
        assert!(Piece::decode(&good[0], 0).is_some());
        let header = |index: u16, count: u16| {
            let mut message = vec![0; 8];
            message.extend_from_slice(&index.to_be_bytes());
            message.extend_from_slice(&count.to_be_bytes());
            message.push(1);
            Bytes::from(message)
        };
        assert!(Piece::decode(&header(0, 2), 0).is_some());
        for (index, count) in [(0, 0), (0, 1), (2, 2), (0, MAX_PIECES as u16 + 1)] {
            assert_eq!(
                Piece::decode(&header(index, count), 0),
                None,
                "{index}/{count}"
            );
        }
        let empty = header(0, 2).slice(..PIECE_HEADER_BYTES);
        assert_eq!(Piece::decode(&empty, 0), None);
        assert_eq!(Piece::decode(&Bytes::from_static(&[0; 5]), 0), None);
    }

    #[test]
    fn at_most_the_bound_of_frames_is_held_in_pieces_and_the_oldest_gives_way() {
        let ids = FrameIds::new();
        let frame = vec![3; 2 * MAX_PIECE_BYTES];
        let mut by_source = ReassemblyBySource::default();
        let mut pending = Vec::new();
        for source in 0..MAX_FRAMES_IN_PIECES as u64 {
            let pieces = pieces_of(&cut(&frame, b"w", b"p", &ids));
            assert_eq!(by_source.push(source, &pieces[0]), None);
            pending.push(pieces);
        }
        assert_eq!(by_source.pending(), MAX_FRAMES_IN_PIECES);
        // A piece that starts nothing is not kept.
        let over = MAX_FRAMES_IN_PIECES as u64;
        assert_eq!(by_source.push(over, &pending[1][1]), None);
        assert_eq!(by_source.pending(), MAX_FRAMES_IN_PIECES);
        // One more frame: the oldest in progress (source 0, say its last piece was lost) gives
        // way, so frames whose pieces were lost never fill the table for good.
        let newest = pieces_of(&cut(&frame, b"w", b"p", &ids));
        assert_eq!(by_source.push(over, &newest[0]), None);
        assert_eq!(by_source.pending(), MAX_FRAMES_IN_PIECES);
        assert_eq!(
            by_source.push(0, &pending[0][1]),
            None,
            "source 0 was dropped"
        );
        assert_eq!(
            by_source.push(over, &newest[1]).as_deref(),
            Some(&frame[..])
        );
        // Finishing one or forgetting a source frees a place.
        assert_eq!(
            by_source.push(1, &pending[1][1]).as_deref(),
            Some(&frame[..])
        );
        by_source.forget(2);
        assert_eq!(by_source.pending(), MAX_FRAMES_IN_PIECES - 3);
        for (source, pieces) in pending.iter().enumerate().skip(3) {
            let got = by_source.push(source as u64, &pieces[1]);
            assert_eq!(got.as_deref(), Some(&frame[..]), "{source}");
        }
        assert_eq!(by_source.pending(), 0);
    }

    #[test]
    fn pieces_past_the_largest_frame_drop_it() {
        let ids = FrameIds::new();
        let mut pieces = pieces_of(&cut(&vec![0; MAX_RELAY_FRAME_BYTES], b"w", b"p", &ids));
        let last = pieces.last_mut().unwrap();
        last.bytes = Bytes::from(vec![0; MAX_PIECE_BYTES + 100]);
        let mut reassembly = Reassembly::default();
        let (last, first) = pieces.split_last().unwrap();
        for piece in first {
            assert_eq!(reassembly.push(piece), None);
        }
        assert_eq!(reassembly.push(last), None);
        assert!(!reassembly.is_pending());
    }
}

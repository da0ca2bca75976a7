//! Frames: oversized, declared-absurd, deeply nested, invalid UTF-8 and garbage frames.

use super::*;

#[tokio::test]
async fn message_fragmented_past_the_frame_limit_closes_with_1009_and_others_keep_working() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    start_echo(&mut other, "echo").await;
    // Frames of 8 MiB each are all under the limit; the message they add up to (72 MiB) is not.
    // The server must stop at the limit instead of buffering the whole message.
    let stream = raw_websocket(server.addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let upload = tokio::spawn(async move {
        let piece = vec![b'a'; 8 * 1024 * 1024];
        let frames = (MAX_FRAME_BYTES / piece.len() as u64) + 1;
        for i in 0..frames {
            let (fin, code) = (i + 1 == frames, if i == 0 { opcode::BINARY } else { 0 });
            let header = ws_frame_header(fin, code, piece.len() as u64);
            if writer.write_all(&header).await.is_err() || writer.write_all(&piece).await.is_err() {
                return i; // the server closed: it did not take the rest
            }
        }
        frames
    });
    // The other session is served while the upload is in progress.
    assert_echoes(&mut other, "echo", "during the upload\n").await;
    let end = read_until_closed(&mut reader, DEADLINE).await;
    assert_eq!(
        end,
        RawEnd::Close(1009),
        "close code for a too-large message"
    );
    tokio::time::timeout(DEADLINE, upload)
        .await
        .unwrap()
        .unwrap();
    assert_echoes(&mut other, "echo", "after the upload\n").await;
    assert_serving(&mut server.client().await).await;
}

#[tokio::test]
async fn frame_declaring_an_absurd_length_is_refused_from_its_header() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    for (what, len) in [
        (
            "2^63 - 1 bytes, the largest length RFC 6455 allows",
            i64::MAX as u64,
        ),
        ("one byte past MAX_FRAME_BYTES", MAX_FRAME_BYTES + 1),
    ] {
        let mut stream = raw_websocket(server.addr()).await;
        let mut frame = ws_frame_header(true, opcode::TEXT, len);
        frame.extend_from_slice(b"{\"id\":1");
        stream.write_all(&frame).await.unwrap();
        let end = read_until_closed(&mut stream, DEADLINE).await;
        assert_eq!(end, RawEnd::Close(1009), "{what}");
    }
    assert_serving(&mut other).await;
}

#[tokio::test]
async fn deeply_nested_json_gets_an_error_and_the_connection_keeps_serving() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    let depth = 100_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    client.send_text(arrays).await;
    let error = expect_envelope_error(&mut client, "100,000 nested arrays").await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{error}"
    );
    // Deep params inside an otherwise valid request: the parser's depth limit answers it, the
    // server does not recurse 100,000 frames deep building or dropping the value.
    let params = format!("{}{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    client
        .send_text(format!(
            r#"{{"id":7,"method":"fs/getMetadata","params":{params}}}"#
        ))
        .await;
    expect_envelope_error(&mut client, "100,000 nested objects in params").await;
    // Unclosed nesting (a truncated document) is an error too.
    client.send_text("[".repeat(depth)).await;
    expect_envelope_error(&mut client, "100,000 unclosed arrays").await;
    assert_serving(&mut client).await;
}

#[tokio::test]
async fn invalid_utf8_in_a_text_frame_closes_cleanly_and_others_keep_working() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    start_echo(&mut other, "echo").await;
    for payload in [
        &b"{\"id\":1,\"method\":\"\xff\xfe\"}"[..],
        b"\xc0\xaf",                     // overlong encoding of '/'
        b"\xed\xa0\x80",                 // a UTF-16 surrogate
        b"{\"a\":\"\xf4\x90\x80\x80\"}", // past U+10FFFF
    ] {
        let mut stream = raw_websocket(server.addr()).await;
        stream
            .write_all(&ws_frame(true, opcode::TEXT, payload))
            .await
            .unwrap();
        // RFC 6455: invalid UTF-8 in a text frame closes with 1007, this connection only.
        let end = read_until_closed(&mut stream, DEADLINE).await;
        assert!(
            matches!(end, RawEnd::Close(1007)),
            "invalid UTF-8 {payload:?} in a text frame: {end:?}"
        );
    }
    // The same bytes in a binary frame are a JSON-RPC error, not a close.
    let mut client = server.client().await;
    client
        .send_binary(b"{\"id\":1,\"method\":\"\xff\xfe\"}".to_vec())
        .await;
    expect_envelope_error(&mut client, "invalid UTF-8 in a binary frame").await;
    assert_serving(&mut client).await;
    assert_echoes(&mut other, "echo", "still here\n").await;
}

#[tokio::test]
async fn binary_garbage_frames_get_errors_and_the_connection_keeps_serving() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    for seed in 1..=50u64 {
        let len = (seed as usize * 997) % 70_000 + 1;
        client.send_binary(garbage(seed, len)).await;
        expect_envelope_error(&mut client, &format!("garbage seed {seed} ({len} bytes)")).await;
    }
    assert_serving(&mut client).await;
}

#[tokio::test]
async fn garbage_instead_of_websocket_frames_closes_the_connection_and_others_keep_working() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    let unmasked = {
        let mut frame = ws_frame(true, opcode::TEXT, b"{}");
        frame[1] &= 0x7F; // clear the mask bit; drop the key
        frame.drain(2..6);
        frame
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("reserved opcode 0x3", ws_frame(true, 0x3, b"x")),
        ("RSV1 set without an extension", {
            let mut frame = ws_frame(true, opcode::TEXT, b"{}");
            frame[0] |= 0x40;
            frame
        }),
        ("an unmasked client frame", unmasked),
        (
            "a continuation with nothing to continue",
            ws_frame(true, opcode::CONTINUATION, b"x"),
        ),
        ("a fragmented ping", ws_frame(false, 0x9, b"x")),
        ("random bytes", garbage(7, 4096)),
    ];
    for (what, bytes) in cases {
        let mut stream = raw_websocket(server.addr()).await;
        let _ = stream.write_all(&bytes).await;
        let end = read_until_closed(&mut stream, DEADLINE).await;
        assert!(
            matches!(end, RawEnd::Close(1002 | 1000) | RawEnd::Eof),
            "{what}: {end:?}"
        );
    }
    assert_serving(&mut other).await;
}

//! Error text for messages and logs.

/// An error and its causes on one line, `outer: cause: root cause` (reqwest's and hyper's own
/// `Display` is only the outermost layer, which says little: "error sending request").
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

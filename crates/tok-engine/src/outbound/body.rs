//! The byte budget: an answer is read chunk by chunk and no further than
//! its budget, so what a service sends (50 MB, or an endless stream) costs
//! at most the budget and one chunk of memory per call (docs/security.md,
//! "Calls tok makes for a tenant").

/// An answer's body as far as it was read.
pub(crate) struct Bounded {
    /// At most the budget's bytes.
    pub(crate) bytes: Vec<u8>,
    /// The whole body fit in the budget; `false` when reading stopped at it.
    pub(crate) complete: bool,
}

/// Reads `response`'s body up to `budget` bytes. A `Content-Length` over
/// the budget stops it before anything is read; past the budget, reading
/// stops and the rest of the body is never taken (the connection is
/// dropped with the response).
pub(crate) async fn read(
    mut response: reqwest::Response,
    budget: usize,
) -> Result<Bounded, reqwest::Error> {
    if response.content_length().is_some_and(|n| n > budget as u64) {
        return Ok(Bounded {
            bytes: Vec::new(),
            complete: false,
        });
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = budget - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Bounded {
                bytes,
                complete: false,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Bounded {
        bytes,
        complete: true,
    })
}

/// The first `budget` bytes of a body, for an error's snippet: a prefix is
/// read even when `Content-Length` announces more.
pub(crate) async fn prefix(
    mut response: reqwest::Response,
    budget: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut bytes = Vec::new();
    while bytes.len() < budget {
        let Some(chunk) = response.chunk().await? else {
            break;
        };
        let room = budget - bytes.len();
        bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(bytes)
}

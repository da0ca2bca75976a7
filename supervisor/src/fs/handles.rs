//! Open `fs/open` handles of one connection, bounded by [`MAX_OPEN_HANDLES`].

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

use super::FsRequestError;
use crate::limits::{MAX_HANDLE_ID_BYTES, MAX_OPEN_HANDLES};

enum Slot {
    Opening,
    Open(Arc<File>),
}

/// The handles of one connection.
#[derive(Default)]
pub struct HandleTable {
    slots: Mutex<HashMap<String, Slot>>,
}

/// A reserved handle id; dropped unfilled, the id is freed.
pub struct HandleReservation<'a> {
    table: &'a HandleTable,
    id: Option<String>,
}

impl HandleReservation<'_> {
    /// Store the opened file.
    pub fn fill(mut self, file: File) {
        if let Some(id) = self.id.take() {
            self.table.lock().insert(id, Slot::Open(Arc::new(file)));
        }
    }
}

impl Drop for HandleReservation<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.table.lock().remove(&id);
        }
    }
}

impl HandleTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserve `id`.
    ///
    /// # Errors
    /// Invalid or duplicate id, or the connection's handles are exhausted.
    pub fn reserve(&self, id: &str) -> Result<HandleReservation<'_>, FsRequestError> {
        if id.is_empty() || id.len() > MAX_HANDLE_ID_BYTES {
            return Err(FsRequestError::HandleIdLength {
                length: id.len(),
                limit: MAX_HANDLE_ID_BYTES,
            });
        }
        let mut slots = self.lock();
        if slots.contains_key(id) {
            return Err(FsRequestError::DuplicateHandle(id.to_owned()));
        }
        if slots.len() >= MAX_OPEN_HANDLES {
            return Err(FsRequestError::TooManyHandles(MAX_OPEN_HANDLES));
        }
        slots.insert(id.to_owned(), Slot::Opening);
        Ok(HandleReservation {
            table: self,
            id: Some(id.to_owned()),
        })
    }

    /// The open file behind `id`.
    ///
    /// # Errors
    /// [`FsRequestError::UnknownHandle`].
    pub fn get(&self, id: &str) -> Result<Arc<File>, FsRequestError> {
        match self.lock().get(id) {
            Some(Slot::Open(file)) => Ok(file.clone()),
            _ => Err(FsRequestError::UnknownHandle(id.to_owned())),
        }
    }

    /// Close `id`.
    ///
    /// # Errors
    /// [`FsRequestError::UnknownHandle`].
    pub fn close(&self, id: &str) -> Result<(), FsRequestError> {
        let mut slots = self.lock();
        match slots.get(id) {
            Some(Slot::Open(_)) => {
                slots.remove(id);
                Ok(())
            }
            _ => Err(FsRequestError::UnknownHandle(id.to_owned())),
        }
    }

    /// Close every handle (the connection ended).
    pub fn close_all(&self) {
        self.lock().clear();
    }
}

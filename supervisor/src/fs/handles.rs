//! Open `fs/open` handles of one connection, bounded by [`MAX_OPEN_HANDLES`] per connection and,
//! across the server, by the client descriptor budget ([`crate::budget`]): each handle holds one
//! descriptor of it from the moment its id is reserved.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

use super::FsRequestError;
use crate::budget::{Budgets, DescriptorCharge};
use crate::limits::{MAX_HANDLE_ID_BYTES, MAX_OPEN_HANDLES};

enum Slot {
    Opening(DescriptorCharge),
    Open(Arc<File>, DescriptorCharge),
}

/// The handles of one connection.
pub struct HandleTable {
    slots: Mutex<HashMap<String, Slot>>,
    budgets: Arc<Budgets>,
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
            let mut slots = self.table.lock();
            let charge = match slots.remove(&id) {
                Some(Slot::Opening(charge) | Slot::Open(_, charge)) => charge,
                None => DescriptorCharge::none(),
            };
            slots.insert(id, Slot::Open(Arc::new(file), charge));
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
    /// An empty table drawing descriptors from `budgets`.
    pub fn new(budgets: Arc<Budgets>) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            budgets,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserve `id`.
    ///
    /// # Errors
    /// Invalid or duplicate id, the connection's handles are exhausted, or the server's
    /// descriptor budget is.
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
        let charge = self.budgets.descriptors(1)?;
        slots.insert(id.to_owned(), Slot::Opening(charge));
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
            Some(Slot::Open(file, _)) => Ok(file.clone()),
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
            Some(Slot::Open(..)) => {
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

/// How strong a [`crate::DistributedLock`]'s exclusion is.
///
/// A consumer that needs cross-process exclusion checks [`ProviderInfo::process_local`] and
/// refuses a process-local provider unless told otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The backend's name (`"memory"`, `"sqlite"`, …).
    pub name: String,
    /// `true` if exclusion holds only inside one process.
    pub process_local: bool,
}

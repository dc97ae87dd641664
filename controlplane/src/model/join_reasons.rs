//! JoinService's own refusal reasons, for any attestor. A file of its own
//! so that the checks JoinService runs from other modules (the expect
//! binding in `hardware`) name them without importing JoinService.

crate::reason::reasons! {
    /// JoinService's own checks, for any attestor: the event's `attestor`
    /// is the one the request named.
    pub(crate) enum JoinReason in "join" {
        CsrKey = "join:csr-key",
        CsrNotVerified = "join:csr-signature",
        UnknownAttestor = "join:unknown-attestor",
        /// An unlisted attestor's role refusal.
        Role = "join:role",
        TokenUnopenable = "token-unopenable",
        /// Another live node holds this machine's hardware key.
        Reclaim = "reclaim",
        NodeKeyStatement = "join:node-key-statement",
        ReclaimUnknown = "join:reclaim-unknown-node",
        ReclaimRetired = "join:reclaim-retired",
        ReclaimRole = "join:reclaim-role",
        /// The machine's hardware key is bound to another node, or the node
        /// to another hardware key of that kind.
        BoundElsewhere = "bound-elsewhere",
        /// The attestor resolved a pool that does not exist.
        UnknownPool = "join:unknown-pool",
        /// The admitting attestor is not in the pool's `policy.joinAttestors`.
        PoolAttestor = "join:pool-attestor",
        /// The join's EK assurance is below the pool's `policy.minEkAssurance`
        /// (or the join proved no EK at all).
        PoolEkAssurance = "join:pool-ek-assurance",
        /// The token's expect binding: the claimed product UUID is empty or
        /// another.
        ExpectProductUuid = "join:expect-product-uuid",
        /// The token's expect binding: its MAC is not among the claimed ones.
        ExpectMac = "join:expect-mac",
    }
}

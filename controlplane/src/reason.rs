//! What a refusal reason is: one enum per place that refuses (JoinService,
//! each attestor, Renew, the site API), each variant spelt once, the way the
//! events, logs and the `on_refusal` hook say it.
//!
//! A leaf: it imports nothing of the crate, so every place can declare its
//! enum with [`reasons!`] without importing another. The listing of every
//! place and its reasons ([`crate::reasons::PLACES`]) is derived from the
//! enums' [`Reason::SPELLINGS`], so a reason added to an enum is listed with it.

use std::fmt;

/// The reasons one place refuses with.
pub(crate) trait Reason: Copy + fmt::Debug + Send + Sync + 'static {
    /// The place: `join` (JoinService itself), an attestor's id, `renew` or
    /// `site`.
    const PLACE: &'static str;
    /// The enum's name, for the listing's check that no enum is left out.
    const NAME: &'static str;
    /// The spellings of every reason of the place, in the order a request
    /// meets them.
    const SPELLINGS: &'static [&'static str];
    /// The spelling events, logs and hooks use.
    fn as_str(self) -> &'static str;
}

/// A reason of any place: what a refusal carries once it leaves the place
/// that decided it (a [`crate::Refusal`], an event to record, the hook's
/// `RefusalEvent`). Made only from a [`Reason`], so it is always one of
/// the listed ones (or a plugin attestor's own enum).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnyReason {
    place: &'static str,
    spelling: &'static str,
}

impl AnyReason {
    /// For [`reasons!`]'s `const fn any`; elsewhere use `From`.
    #[doc(hidden)]
    pub const fn of(place: &'static str, spelling: &'static str) -> Self {
        AnyReason { place, spelling }
    }

    /// The spelling events, logs and hooks use.
    pub const fn as_str(&self) -> &'static str {
        self.spelling
    }

    /// The place whose enum it is.
    pub const fn place(&self) -> &'static str {
        self.place
    }
}

impl<R: Reason> From<R> for AnyReason {
    fn from(r: R) -> Self {
        AnyReason::of(R::PLACE, r.as_str())
    }
}

impl<R: Reason> PartialEq<R> for AnyReason {
    fn eq(&self, other: &R) -> bool {
        *self == AnyReason::from(*other)
    }
}

impl fmt::Display for AnyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spelling)
    }
}

impl fmt::Debug for AnyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:?}", self.place, self.spelling)
    }
}

/// Declares a place's reason enum: the variants, their spellings, and the
/// [`Reason`] impl with `SPELLINGS` generated from the same list,
/// so neither can miss a variant.
///
/// ```ignore
/// crate::reason::reasons! {
///     /// JoinService's own reasons.
///     pub enum JoinReason in "join" {
///         /// The CSR's key is not P-256.
///         CsrKey = "join:csr-key",
///     }
/// }
/// ```
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $place:tt {
            $( $(#[$vmeta:meta])* $variant:ident = $spelling:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// The spelling events, logs and hooks use.
            $vis const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $spelling, )+
                }
            }

            /// As a reason of any place.
            $vis const fn any(self) -> $crate::reason::AnyReason {
                $crate::reason::AnyReason::of($place, self.as_str())
            }
        }

        impl $crate::reason::Reason for $name {
            const PLACE: &'static str = $place;
            const NAME: &'static str = stringify!($name);
            const SPELLINGS: &'static [&'static str] = &[ $( $spelling, )+ ];
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }

        /// Tests compare what a refusal recorded (its spelling) with it.
        #[cfg(test)]
        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self == other.as_str()
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use reasons;

#[cfg(test)]
mod tests {
    use super::*;

    reasons! {
        enum Sample in "sample" {
            First = "first",
            Second = "second",
        }
    }

    #[test]
    fn all_and_spellings_follow_the_declaration() {
        assert_eq!(Sample::SPELLINGS, &["first", "second"]);
        assert_eq!(Sample::Second.to_string(), "second");
        let any = AnyReason::from(Sample::First);
        assert_eq!(any.as_str(), "first");
        assert_eq!(any.place(), "sample");
        assert_eq!(any, Sample::First);
        assert_ne!(any, Sample::Second);
        assert_eq!(Sample::First.any(), any);
    }
}

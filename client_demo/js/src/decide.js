// Whether a reader may press an approval's buttons (docs/protocol.md §3 "Who decides"), as far
// as a client can tell from the thread's events: the call's `decided_by`, the reader's roles
// and the thread's owner. The gateway checks again (four-eyes included) and refuses with
// `forbidden`; where a reader has the approval object (the inbox, `GET /v1/runs/{run_id}`), its
// `can_decide` is the gateway's own answer.

const REVIEWERS = ["reviewer", "admin"];

/**
 * @param {{decidedBy?: string | null, reviewerRoles?: string[] | null}} approval
 * @param {{user: string, roles: string[], owner?: string | null}} reader
 * @returns {boolean}
 */
export function mayDecide(approval, reader) {
  const roles = reader.roles || [];
  const reviewer = REVIEWERS.some((role) => roles.includes(role));
  // The run's own user: the thread's owner, holding the `user` role (§3 "owning user").
  const ownUser = Boolean(reader.owner) && reader.user === reader.owner && roles.includes("user");
  const needed = approval.reviewerRoles || [];
  const holdsRole = needed.length === 0 || needed.some((role) => roles.includes(role));
  switch (approval.decidedBy) {
    case "user":
      return ownUser;
    case "either":
      return (reviewer || ownUser) && holdsRole;
    default:
      // "reviewer", or a gateway from before `decided_by`: reviewers and admins.
      return reviewer && holdsRole;
  }
}

package authcallout

import (
	"slices"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// UserPermissions are p, a role's permissions in the servers'
// configuration form, as a user JWT carries them. The server turns a
// JWT's permissions back into its own form field by field (an empty list
// is no list; no lists at all are the account's defaults, everything), so
// each list is copied as it is: allow and deny, publish and subscribe, and
// the responses a user may send. nil, everything, is no permissions.
func UserPermissions(p *server.Permissions) jwt.Permissions {
	var out jwt.Permissions
	if p == nil {
		return out
	}
	if p.Publish != nil {
		out.Pub = jwt.Permission{Allow: slices.Clone(p.Publish.Allow), Deny: slices.Clone(p.Publish.Deny)}
	}
	if p.Subscribe != nil {
		out.Sub = jwt.Permission{Allow: slices.Clone(p.Subscribe.Allow), Deny: slices.Clone(p.Subscribe.Deny)}
	}
	if p.Response != nil {
		out.Resp = &jwt.ResponsePermission{MaxMsgs: p.Response.MaxMsgs, Expires: p.Response.Expires}
	}
	return out
}

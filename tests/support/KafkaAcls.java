// Creates the ACLs SECURITY.md documents, through Kafka's own Admin API (the security tests run it
// with `java -cp '<kafka lib>/*' KafkaAcls.java BOOTSTRAP policy-acls TOPIC OPERATOR DAEMON`).
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class KafkaAcls {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        String topic = args[2], operator = args[3], daemon = args[4];
        ResourcePattern policy = new ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL);
        List<AclBinding> acls = List.of(
            allow(policy, "User:" + operator, AclOperation.WRITE),
            allow(policy, "User:" + operator, AclOperation.DESCRIBE),
            allow(policy, "User:" + daemon, AclOperation.READ),
            allow(policy, "User:" + daemon, AclOperation.DESCRIBE));
        try (Admin admin = Admin.create(props)) {
            admin.createAcls(acls).all().get();
        }
        for (AclBinding b : acls) System.out.println(b);
    }

    static AclBinding allow(ResourcePattern r, String principal, AclOperation op) {
        return new AclBinding(r, new AccessControlEntry(principal, "*", op, AclPermissionType.ALLOW));
    }
}
